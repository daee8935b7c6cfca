//! The shipping service: its `shipments` table, kept by a handler that
//! applies the orders service's events in order, each exactly once.

use ordo_core::{ApplyContext, ApplyHandler, BlockCode, Envelope, StoreError, Verdict};
use ordo_sqlite::rusqlite::{params, Connection};
use ordo_sqlite::Schema;
use serde::de::DeserializeOwned;

use crate::orders::{OrderCancelled, OrderPaid, OrderPlaced, CANCELLED, PAID, PLACED};

/// An event type this service does not know (yet): held for an operator,
/// or for a release that knows it.
pub const UNKNOWN_EVENT_TYPE: BlockCode = BlockCode::from_static("unknown_event_type");
/// A payload that does not decode as its type's struct.
pub const BAD_PAYLOAD: BlockCode = BlockCode::from_static("bad_payload");
/// An event about an order this service never saw placed.
pub const UNKNOWN_ORDER: BlockCode = BlockCode::from_static("unknown_order");

/// The shipping service's own tables, beside ordo's inbox in the same file.
/// `events` counts the events applied to each shipment.
pub fn schema() -> Schema {
    Schema::new("shipping")
        .expect("a valid domain name")
        .migration(
            "CREATE TABLE shipments (
             order_id    TEXT    PRIMARY KEY,
             status      TEXT    NOT NULL,
             total_cents INTEGER NOT NULL,
             events      INTEGER NOT NULL
         )",
        )
}

pub struct Shipping;

impl ApplyHandler<Connection> for Shipping {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, Connection>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let (order_id, status) = match event.event_type.as_str() {
            PLACED => {
                let placed = match decode::<OrderPlaced>(event) {
                    Ok(placed) => placed,
                    Err(blocked) => return Ok(blocked),
                };
                tx.execute(
                    "INSERT INTO shipments VALUES (?1, 'pending', ?2, 0)",
                    params![placed.order_id, placed.total_cents],
                )?;
                (placed.order_id, "pending")
            }
            PAID => match decode::<OrderPaid>(event) {
                Ok(paid) => (paid.order_id, "ready"),
                Err(blocked) => return Ok(blocked),
            },
            CANCELLED => match decode::<OrderCancelled>(event) {
                Ok(cancelled) => (cancelled.order_id, "cancelled"),
                Err(blocked) => return Ok(blocked),
            },
            other => {
                let detail = format!("no handler for {other:?}");
                return Ok(Verdict::block_with(UNKNOWN_EVENT_TYPE, detail));
            }
        };
        let changed = tx.execute(
            "UPDATE shipments SET status = ?2, events = events + 1 WHERE order_id = ?1",
            params![order_id, status],
        )?;
        if changed == 0 {
            return Ok(Verdict::block_with(UNKNOWN_ORDER, order_id));
        }
        Ok(Verdict::Apply)
    }
}

/// The event's payload as `T`, or a block with code `bad_payload` saying why
/// not.
fn decode<T: DeserializeOwned>(event: &Envelope) -> Result<T, Verdict> {
    event.payload_as().map_err(|e| {
        let detail = format!("{} does not decode: {e}", event.event_type);
        Verdict::block_with(BAD_PAYLOAD, detail)
    })
}
