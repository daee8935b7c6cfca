//! The application's domain: `ledger`, one row per applied event with the
//! amount its payload carries. One schema for both backends (its SQL reads
//! the same in both dialects), one handler per backend's transaction.

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

/// The row an event writes: its id, flow, seq and amount; `None` for an
/// event whose payload has no integer `amount`.
fn row(event: &Envelope) -> Option<(&str, &str, i64, i64)> {
    let amount = event.payload.get("amount")?.as_i64()?;
    Some((
        event.event_id.as_str(),
        event.flow_id.as_str(),
        event.seq.get(),
        amount,
    ))
}

impl ApplyHandler<Connection> for Ledger {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, Connection>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let Some((event_id, flow_id, seq, amount)) = row(event) else {
            return Ok(Verdict::block(NO_AMOUNT));
        };
        tx.execute(
            "INSERT INTO ledger (event_id, flow_id, seq, amount) VALUES (?1, ?2, ?3, ?4)",
            params![event_id, flow_id, seq, amount],
        )?;
        Ok(Verdict::Apply)
    }
}

impl ApplyHandler<PgTx> for Ledger {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, PgTx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let Some((event_id, flow_id, seq, amount)) = row(event) else {
            return Ok(Verdict::block(NO_AMOUNT));
        };
        tx.execute(
            "INSERT INTO ledger (event_id, flow_id, seq, amount) VALUES ($1, $2, $3, $4)",
            &[&event_id, &flow_id, &seq, &amount],
        )?;
        Ok(Verdict::Apply)
    }
}
