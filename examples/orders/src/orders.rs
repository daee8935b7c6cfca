//! The orders service: its `orders` table and the events it publishes, each
//! change and its event committed in one transaction.

use ordo_core::OutboxTx;
use std::path::Path;

use ordo_core::{FlowId, SchemaVersion};
use ordo_sqlite::rusqlite::params;
use ordo_sqlite::{ProducerDb, Schema};
use serde::{Deserialize, Serialize};

use crate::Error;

/// Event types, one per change of an order.
pub const PLACED: &str = "order_placed";
pub const PAID: &str = "order_paid";
pub const CANCELLED: &str = "order_cancelled";

#[derive(Debug, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub customer: String,
    pub total_cents: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct OrderPaid {
    pub order_id: String,
    pub amount_cents: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct OrderCancelled {
    pub order_id: String,
    pub reason: String,
}

/// The orders service's own tables, beside ordo's outbox in the same file.
pub fn schema() -> Schema {
    Schema::new("orders")
        .expect("a valid domain name")
        .migration(
            "CREATE TABLE orders (
             order_id    TEXT    PRIMARY KEY,
             customer    TEXT    NOT NULL,
             total_cents INTEGER NOT NULL,
             status      TEXT    NOT NULL
         )",
        )
}

pub struct Orders {
    pub db: ProducerDb,
}

impl Orders {
    pub fn open(path: &Path) -> Result<Orders, Error> {
        Ok(Orders {
            db: ProducerDb::open(path, &schema())?,
        })
    }

    pub fn count(&self) -> Result<i64, Error> {
        let sql = "SELECT count(*) FROM orders";
        Ok(self.db.connection().query_row(sql, [], |row| row.get(0))?)
    }

    pub fn place(&mut self, order_id: &str, customer: &str, total_cents: i64) -> Result<(), Error> {
        let event = OrderPlaced {
            order_id: order_id.into(),
            customer: customer.into(),
            total_cents,
        };
        self.db.write(|tx| -> Result<(), Error> {
            tx.sql().execute(
                "INSERT INTO orders VALUES (?1, ?2, ?3, 'placed')",
                params![order_id, customer, total_cents],
            )?;
            tx.append(&FlowId::new(order_id)?, PLACED, SchemaVersion::V1, &event)?;
            Ok(())
        })
    }

    pub fn pay(&mut self, order_id: &str) -> Result<(), Error> {
        self.close(order_id, "paid", PAID, |total_cents| OrderPaid {
            order_id: order_id.into(),
            amount_cents: total_cents,
        })
    }

    pub fn cancel(&mut self, order_id: &str, reason: &str) -> Result<(), Error> {
        self.close(order_id, "cancelled", CANCELLED, |_| OrderCancelled {
            order_id: order_id.into(),
            reason: reason.into(),
        })
    }

    /// Moves a placed order to `status` and publishes `event_type` with the
    /// payload built from the order's total, in one transaction.
    fn close<T: Serialize>(
        &mut self,
        order_id: &str,
        status: &str,
        event_type: &str,
        payload: impl FnOnce(i64) -> T,
    ) -> Result<(), Error> {
        self.db.write(|tx| -> Result<(), Error> {
            let total_cents: i64 = tx.sql().query_row(
                "UPDATE orders SET status = ?2 WHERE order_id = ?1 AND status = 'placed'
                 RETURNING total_cents",
                params![order_id, status],
                |row| row.get(0),
            )?;
            let flow = FlowId::new(order_id)?;
            tx.append(&flow, event_type, SchemaVersion::V1, &payload(total_cents))?;
            Ok(())
        })
    }
}
