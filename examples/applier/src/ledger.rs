//! The application's domain: `ledger`, one row per applied event with the
//! amount its payload carries. One schema for both backends (its SQL reads
//! the same in both dialects), one handler for both backends' transactions,
//! each of which inserts the rows with its own placeholders.

use ordo_core::{ApplyContext, ApplyHandler, BlockCode, Envelope, StoreError, Verdict};
use ordo_postgres::PgTx;
use ordo_sqlite::rusqlite::{params, Connection};

/// The domain's name.
pub const DOMAIN: &str = "ledger";

/// An event whose payload has no integer `amount`.
pub const NO_AMOUNT: BlockCode = BlockCode::from_static("no_amount");

/// The domain's tables, on either backend.
pub fn schema() -> ordo_core::domain::Schema {
    ordo_core::domain::Schema::new(DOMAIN)
        .expect("a valid domain name")
        .migration(
            "CREATE TABLE ledger (event_id TEXT PRIMARY KEY, flow_id TEXT NOT NULL,
                                  seq BIGINT NOT NULL, amount BIGINT NOT NULL)",
        )
}

/// Writes each event's row in the apply transaction.
pub struct Ledger;

/// A ledger row: an event's id, flow, seq and amount.
type Row<'e> = (&'e str, &'e str, i64, i64);

/// The row an event writes; `None` for an event whose payload has no
/// integer `amount`.
fn row(event: &Envelope) -> Option<Row<'_>> {
    let amount = event.payload.get("amount")?.as_i64()?;
    Some((
        event.event_id.as_str(),
        event.flow_id.as_str(),
        event.seq.get(),
        amount,
    ))
}

/// A backend's transaction, as the ledger writes its rows in it.
trait LedgerTx {
    /// Inserts `row`.
    fn insert(&self, row: Row<'_>) -> Result<(), StoreError>;
}

impl LedgerTx for Connection {
    fn insert(&self, (id, flow, seq, amount): Row<'_>) -> Result<(), StoreError> {
        let sql = "INSERT INTO ledger (event_id, flow_id, seq, amount) VALUES (?1, ?2, ?3, ?4)";
        self.execute(sql, params![id, flow, seq, amount])?;
        Ok(())
    }
}

impl LedgerTx for PgTx {
    fn insert(&self, (id, flow, seq, amount): Row<'_>) -> Result<(), StoreError> {
        let sql = "INSERT INTO ledger (event_id, flow_id, seq, amount) VALUES ($1, $2, $3, $4)";
        self.execute(sql, &[&id, &flow, &seq, &amount])?;
        Ok(())
    }
}

impl<Tx: LedgerTx> ApplyHandler<Tx> for Ledger {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, Tx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let Some(row) = row(event) else {
            return Ok(Verdict::block(NO_AMOUNT));
        };
        tx.insert(row)?;
        Ok(Verdict::Apply)
    }
}
