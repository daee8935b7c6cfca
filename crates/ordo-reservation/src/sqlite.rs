//! The reservation domain on SQLite: its tables, its handler and its
//! `advance`, written against `ordo-sqlite`'s public API.

use ordo_core::ops::{whole_read, whole_read_limit, WHOLE_READ_ROWS_MAX};
use ordo_core::OutboxTx;
use ordo_core::{
    crash, ApplyContext, ApplyHandler, BlockCode, ConsumerStore, Drain, Envelope, EventId, FlowId,
    InboxFlow, Seq, Step, StoreError, Verdict,
};
use ordo_sqlite::{ConsumerDb, ProducerDb, ProducerTx};
use rusqlite::{params, Connection, OptionalExtension};

use crate::rows::{effect_record, flow_record, projection};
use crate::rules::{
    decide_advance, decide_apply, AdvanceDecision, AdvanceRefused, AdvanceRequest, ApplyOptions,
    FlowRecord, FlowState, Projection,
};
use crate::schema::{consumer_schema, producer_schema};

/// The domain name of reservation stores.
pub const DOMAIN: &str = "reservation";

/// The name of the effect intent the handler records when given a webhook
/// URL: the one the built-in webhook executor runs.
pub const WEBHOOK_EFFECT: &str = "webhook";

/// The outcome of an advance.
#[derive(Debug, Clone, PartialEq)]
pub enum Advance {
    /// The state change and the event were committed together.
    Committed(Envelope),
    /// `expected_seq` differed from the flow's `last_seq`; nothing was written.
    Stale {
        /// The flow's actual `last_seq`.
        last_seq: i64,
    },
    /// The target is not the legal next step; nothing was written.
    InvalidTransition {
        /// The flow's state.
        from: FlowState,
        /// The requested state.
        to: FlowState,
    },
}

/// Why an advance failed (as opposed to a protocol outcome).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdvanceError {
    /// The request is refused by the flow's state; nothing was written.
    #[error(transparent)]
    Refused(#[from] AdvanceRefused),
    /// The store failed; nothing was committed unless the kind is
    /// `CommitOutcomeUnknown`.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ordo_core::AppendError> for AdvanceError {
    fn from(error: ordo_core::AppendError) -> AdvanceError {
        match error {
            ordo_core::AppendError::Store(e) => AdvanceError::Store(e),
            // decide_advance allocated the next seq and id under the same
            // write lock: any other refusal means a damaged file.
            other => AdvanceError::Store(StoreError::new(
                ordo_core::ErrorKind::Corrupt,
                format!("producer: {other}"),
            )),
        }
    }
}

/// One effect record: written once per applied event, in the same
/// transaction as the projection change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRecord {
    /// The producer whose flow it is.
    pub producer: ordo_core::ProducerName,
    /// The flow.
    pub flow_id: FlowId,
    /// The applied seq.
    pub seq: Seq,
    /// The applied event.
    pub event_id: EventId,
}

/// The reservation producer: `advance` and the flows.
pub trait ReservationProducer {
    /// Advances a flow by one step: in one write transaction, reads the flow,
    /// decides with [`decide_advance`], and commits the new state together
    /// with the event, or writes nothing.
    fn advance(&mut self, request: &AdvanceRequest) -> Result<Advance, AdvanceError>;

    /// Decides every request in order in ONE write transaction (each sees
    /// the ones before it) and commits all committed steps together. A
    /// refused request writes nothing and does not stop the others.
    #[allow(clippy::type_complexity)]
    fn advance_batch(
        &mut self,
        requests: &[AdvanceRequest],
    ) -> Result<Vec<Result<Advance, AdvanceRefused>>, StoreError>;

    /// Every flow that has a record, ordered by flow id.
    fn flows(&mut self) -> Result<Vec<FlowRecord>, StoreError>;
}

/// The reservation consumer: apply with the reservation handler, and its
/// tables.
pub trait ReservationConsumer: ConsumerStore {
    /// [`ConsumerStore::apply_next_with`] with [`ReservationHandler`].
    fn apply_next(&mut self, flow: &InboxFlow, options: ApplyOptions) -> Result<Step, StoreError>;

    /// [`ConsumerStore::apply_batch_with`] with [`ReservationHandler`].
    fn apply_batch(
        &mut self,
        flows: &[(InboxFlow, Option<u64>)],
        events_max: u64,
        options: ApplyOptions,
    ) -> Result<Vec<Drain>, StoreError>;

    /// [`ordo_core::drain`] with [`ReservationHandler`].
    fn drain(
        &mut self,
        flow: &InboxFlow,
        limit: Option<u64>,
        options: ApplyOptions,
        batch_len_max: u64,
    ) -> Result<Drain, StoreError>;

    /// [`ordo_core::process_all`] with [`ReservationHandler`].
    fn process_all(
        &mut self,
        limit: Option<u64>,
        options: ApplyOptions,
        batch_len_max: u64,
    ) -> Result<Vec<Drain>, StoreError>;

    /// Flows with work for the handler of `options`.
    fn flows_with_reservation_work(
        &mut self,
        options: ApplyOptions,
    ) -> Result<Vec<InboxFlow>, StoreError>;

    /// Every projection, ordered by flow id.
    fn projections(&mut self) -> Result<Vec<Projection>, StoreError>;

    /// The flow's projection ([`Projection::empty`] before anything is
    /// applied). The stores of this crate read it by its key, however many
    /// flows there are; this default looks through every projection.
    fn projection(&mut self, flow: &InboxFlow) -> Result<Projection, StoreError> {
        Ok(self
            .projections()?
            .into_iter()
            .find(|p| &p.inbox_flow() == flow)
            .unwrap_or_else(|| Projection::empty_of(flow)))
    }

    /// Every effect record, ordered by flow id then seq.
    fn effects(&mut self) -> Result<Vec<EffectRecord>, StoreError>;
}

/// The reference domain's handler: validates the event against the flow's
/// projection, then updates the projection and inserts one effect record;
/// otherwise blocks with `unsupported_schema`, `invalid_payload` or
/// `invalid_transition`. With schema 2 support it re-evaluates rows blocked
/// for `unsupported_schema`. Given a webhook URL, it also records for every
/// event it applies a `webhook` effect intent (EFFECTS.md) posting the
/// event to that URL.
#[derive(Debug, Default, Clone)]
pub struct ReservationHandler {
    options: ApplyOptions,
    webhook: Option<std::sync::Arc<str>>,
}

const REEVALUATE_V2: [BlockCode; 1] = [BlockCode::from_static("unsupported_schema")];

impl ReservationHandler {
    /// A handler decoding the schemas `options` enables.
    pub fn new(options: ApplyOptions) -> ReservationHandler {
        ReservationHandler {
            options,
            webhook: None,
        }
    }

    /// This handler, recording for every event it applies the intent
    /// [`WEBHOOK_EFFECT`] with the request `{"url": url, "body":
    /// {"producer": P, "event": ENVELOPE}}` (ENVELOPE the applied event's
    /// envelope as received). Whether `url` may be called is decided by
    /// the executor that runs the intent.
    pub fn with_webhook(self, url: impl Into<std::sync::Arc<str>>) -> ReservationHandler {
        ReservationHandler {
            webhook: Some(url.into()),
            ..self
        }
    }

    /// The URL every applied event's `webhook` intent posts to, if any.
    pub fn webhook(&self) -> Option<&str> {
        self.webhook.as_deref()
    }

    /// The `webhook` request of `event`, when the handler has a URL.
    pub fn webhook_request(&self, event: &Envelope) -> Option<serde_json::Value> {
        self.webhook.as_deref().map(|url| {
            serde_json::json!({
                "url": url,
                "body": {"producer": event.producer.as_str(), "event": event.to_value()},
            })
        })
    }

    /// Records the `webhook` intent of `event` through `cx`, when the
    /// handler has a URL.
    pub fn record_webhook<Tx: ?Sized>(
        &self,
        cx: &mut ApplyContext<'_, Tx>,
        event: &Envelope,
    ) -> Result<(), StoreError> {
        if let Some(request) = self.webhook_request(event) {
            cx.effect_for(event, WEBHOOK_EFFECT, &request)?;
        }
        Ok(())
    }

    /// The schemas this handler decodes.
    pub fn options(&self) -> ApplyOptions {
        self.options
    }

    /// The block codes this handler evaluates again (the same for every
    /// backend's transaction type).
    pub fn reevaluate(&self) -> &[BlockCode] {
        if self.options.support_v2 {
            &REEVALUATE_V2
        } else {
            &[]
        }
    }
}

impl ApplyHandler<Connection> for ReservationHandler {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, Connection>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let current = read_projection(tx, &event.inbox_flow())?;
        let next = match decide_apply(&current, event, self.options) {
            Ok(next) => next,
            Err(reason) => return Ok(Verdict::Block(reason)),
        };
        let quantity = next.quantity.expect("an applied step has a quantity");
        tx.prepare_cached(
            "INSERT INTO projection (flow_id, producer, state, quantity, applied_seq)
             VALUES (?1, ?5, ?2, ?3, ?4)
             ON CONFLICT (flow_id, producer) DO UPDATE SET state = excluded.state,
                 quantity = excluded.quantity, applied_seq = excluded.applied_seq",
        )?
        .execute(params![
            next.flow_id.as_str(),
            next.state.as_str(),
            quantity.get(),
            next.applied_seq,
            next.producer.as_str(),
        ])?;
        crash::point(crash::CONSUMER_APPLY_AFTER_PROJECTION);
        tx.prepare_cached(
            "INSERT INTO effect (flow_id, producer, seq, event_id) VALUES (?1, ?4, ?2, ?3)",
        )?
        .execute(params![
            event.flow_id.as_str(),
            event.seq.get(),
            event.event_id.as_str(),
            event.producer.as_str(),
        ])?;
        crash::point(crash::CONSUMER_APPLY_AFTER_EFFECT);
        self.record_webhook(tx, event)?;
        Ok(Verdict::Apply)
    }

    fn reevaluate(&self) -> &[BlockCode] {
        ReservationHandler::reevaluate(self)
    }
}

fn read_projection(conn: &Connection, flow: &InboxFlow) -> Result<Projection, StoreError> {
    let row: Option<(String, i64, i64)> = conn
        .prepare_cached(
            "SELECT state, quantity, applied_seq FROM projection
             WHERE flow_id = ?1 AND producer = ?2",
        )?
        .query_row([flow.flow_id.as_str(), flow.producer.as_str()], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .optional()?;
    match row {
        None => Ok(Projection::empty_of(flow)),
        Some((state, quantity, applied_seq)) => {
            let flow_id = flow.flow_id.as_str();
            projection(
                (flow.producer.as_str(), flow_id),
                &state,
                quantity,
                applied_seq,
            )
        }
    }
}

/// Decides and writes one advance inside a producer transaction the caller
/// holds (a [`ProducerDb::write`] or a unit of an
/// [`ordo_sqlite::GroupWriter`]): reads the flow, decides with
/// [`decide_advance`], writes the new state and appends the event, or writes
/// nothing. Crash points are the transaction owner's.
pub fn advance_in(
    ptx: &mut ProducerTx<'_>,
    request: &AdvanceRequest,
) -> Result<Advance, AdvanceError> {
    Ok(advance_in_tx(ptx, request)??)
}

/// Decides and writes one advance inside `ptx`; a refusal writes nothing.
/// Advances each request in turn in one transaction.
fn advance_all_in_tx(
    ptx: &mut ProducerTx<'_>,
    requests: &[AdvanceRequest],
) -> Result<Vec<Result<Advance, AdvanceRefused>>, AdvanceError> {
    requests
        .iter()
        .map(|request| advance_in_tx(ptx, request))
        .collect()
}

/// A backend's producer transaction, as an advance reads and writes the
/// flow table in it.
pub(crate) trait FlowTx: OutboxTx {
    /// The flow's record with its last seq (a new flow's when it has none).
    fn flow(&mut self, flow_id: &FlowId) -> Result<FlowRecord, StoreError>;

    /// Writes `flow`, the flow's new record, and appends `event`, its step.
    fn write_step(&mut self, flow: &FlowRecord, event: &Envelope) -> Result<(), AdvanceError>;
}

/// Reads the flow, decides with [`decide_advance`], and writes a committed
/// step, all inside `ptx`; a refusal writes nothing.
pub(crate) fn advance_in_tx(
    ptx: &mut impl FlowTx,
    request: &AdvanceRequest,
) -> Result<Result<Advance, AdvanceRefused>, AdvanceError> {
    let current = ptx.flow(&request.flow_id)?;
    let decision = match decide_advance(&current, request) {
        Ok(decision) => decision,
        Err(refused) => return Ok(Err(refused)),
    };
    Ok(Ok(match decision {
        AdvanceDecision::Stale { last_seq } => Advance::Stale { last_seq },
        AdvanceDecision::InvalidTransition { from, to } => Advance::InvalidTransition { from, to },
        AdvanceDecision::Commit { flow, event } => {
            let producer = ptx.producer_name().clone();
            let event = Envelope { producer, ..event };
            ptx.write_step(&flow, &event)?;
            Advance::Committed(event)
        }
    }))
}

impl FlowTx for ProducerTx<'_> {
    fn flow(&mut self, flow_id: &FlowId) -> Result<FlowRecord, StoreError> {
        let row: Option<(String, i64)> = self
            .sql()
            .prepare_cached("SELECT state, quantity FROM flow WHERE flow_id = ?1")?
            .query_row([flow_id.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let last_seq = self.last_seq(flow_id)?;
        match row {
            None => Ok(FlowRecord {
                last_seq,
                ..FlowRecord::new_flow(flow_id.clone())
            }),
            Some((state, quantity)) => flow_record(flow_id.as_str(), &state, quantity, last_seq),
        }
    }

    fn write_step(&mut self, flow: &FlowRecord, event: &Envelope) -> Result<(), AdvanceError> {
        let quantity = flow.quantity.expect("a committed flow has a quantity");
        self.sql()
            .prepare_cached(
                "INSERT INTO flow (flow_id, state, quantity) VALUES (?1, ?2, ?3)
                 ON CONFLICT (flow_id) DO UPDATE SET state = excluded.state,
                     quantity = excluded.quantity",
            )
            .and_then(|mut insert| {
                insert.execute(params![
                    flow.flow_id.as_str(),
                    flow.state.as_str(),
                    quantity.get()
                ])
            })
            .map_err(|e| StoreError::sqlite("producer: cannot write the flow", e))?;
        self.append_envelope(event)?;
        Ok(())
    }
}

/// Every row `sql` reads from `table`, each through `convert`; none when
/// the store has no such table (a store of another domain).
fn read_table<R, T>(
    conn: &Connection,
    table: &str,
    sql: &str,
    read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<R>,
    mut convert: impl FnMut(R) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let exists: bool = conn
        .prepare_cached(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        )?
        .query_row([table], |row| row.get(0))?;
    if !exists {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare_cached(&format!("{sql} LIMIT ?1"))?;
    let rows = stmt.query_map([whole_read_limit(WHOLE_READ_ROWS_MAX)], read)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(convert(row?)?);
    }
    whole_read(table, WHOLE_READ_ROWS_MAX, out)
}

/// The four columns `flow_id, state, quantity, n` of a flow or projection row.
fn four(row: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, i64, i64)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

/// Every flow of a reservation producer store, ordered by flow id.
pub(crate) fn read_flows(conn: &Connection) -> Result<Vec<FlowRecord>, StoreError> {
    read_table(
        conn,
        "flow",
        "SELECT f.flow_id, f.state, f.quantity, coalesce(h.last_seq, 0)
         FROM flow f LEFT JOIN outbox_head h ON h.flow_id = f.flow_id ORDER BY f.flow_id",
        four,
        |(flow_id, state, quantity, last_seq)| flow_record(&flow_id, &state, quantity, last_seq),
    )
}

/// Every projection, ordered by flow id.
pub(crate) fn read_projections(conn: &Connection) -> Result<Vec<Projection>, StoreError> {
    read_table(
        conn,
        "projection",
        "SELECT flow_id, producer, state, quantity, applied_seq FROM projection
         ORDER BY flow_id, producer",
        |row| {
            let key: (String, String) = (row.get(0)?, row.get(1)?);
            Ok((key, row.get::<_, String>(2)?, row.get(3)?, row.get(4)?))
        },
        |((flow_id, producer), state, quantity, applied_seq)| {
            projection((&producer, &flow_id), &state, quantity, applied_seq)
        },
    )
}

/// Every effect, ordered by flow id then seq.
pub(crate) fn read_effects(conn: &Connection) -> Result<Vec<EffectRecord>, StoreError> {
    read_table(
        conn,
        "effect",
        "SELECT flow_id, producer, seq, event_id FROM effect ORDER BY flow_id, producer, seq",
        |row| {
            Ok((
                (row.get::<_, String>(1)?, row.get::<_, String>(0)?),
                row.get::<_, i64>(2)?,
                row.get::<_, String>(3)?,
            ))
        },
        |(key, seq, event_id)| effect_record(key, seq, event_id),
    )
}

impl ReservationProducer for ProducerDb {
    crate::methods::advance_methods!(advance_in_tx, advance_all_in_tx, read_flows);
}

impl ReservationConsumer for ConsumerDb {
    crate::methods::apply_methods!(read_projections, read_projection, read_effects);
}

/// Opens or creates a reservation producer store with the system clock and
/// default options.
pub fn open_producer(path: impl AsRef<std::path::Path>) -> Result<ProducerDb, StoreError> {
    ProducerDb::open(path, &producer_schema())
}

/// Opens or creates a reservation consumer store with the system clock and
/// default options.
pub fn open_consumer(path: impl AsRef<std::path::Path>) -> Result<ConsumerDb, StoreError> {
    ConsumerDb::open(path, &consumer_schema())
}

/// The flows and the outbox, read in one read transaction (no flows for a
/// store of another domain).
pub fn producer_snapshot(
    producer: &mut ProducerDb,
) -> Result<(Vec<FlowRecord>, Vec<ordo_core::OutboxRecord>), StoreError> {
    producer.read(|conn| {
        let flows = read_flows(conn)?;
        let outbox = ordo_sqlite::read_outbox(conn)?;
        Ok((flows, outbox))
    })
}

/// The flows and the outbox with each row's custody by destination, read
/// in one read transaction (no flows for a store of another domain).
pub fn producer_snapshot_entries(
    producer: &mut ProducerDb,
) -> Result<(Vec<FlowRecord>, Vec<ordo_core::ops::OutboxEntry>), StoreError> {
    producer.read(|conn| Ok((read_flows(conn)?, ordo_sqlite::read_outbox_entries(conn)?)))
}

/// The rows of a consumer snapshot: the inbox, the projections and the
/// effects.
pub type ConsumerRows = (
    Vec<ordo_core::InboxRecord>,
    Vec<Projection>,
    Vec<EffectRecord>,
);

/// The inbox, the projections and the effects, read in one read
/// transaction (no projections or effects for a store of another domain).
pub fn consumer_snapshot(consumer: &mut ConsumerDb) -> Result<ConsumerRows, StoreError> {
    consumer.read(|conn| {
        Ok((
            ordo_sqlite::read_inbox(conn)?,
            read_projections(conn)?,
            read_effects(conn)?,
        ))
    })
}
