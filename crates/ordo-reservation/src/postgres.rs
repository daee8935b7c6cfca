//! The reservation domain on PostgreSQL: its tables (in the connection's
//! `search_path`, `public` by default, beside ordo's own schemas), its
//! handler and its `advance`, written against `ordo-postgres`'s public API.
//! The rules are the same as on SQLite (`rules.rs`); only the SQL differs.

use ordo_core::OutboxTx;
use std::collections::{BTreeMap, HashMap, HashSet};

use ordo_core::ops::{whole_read, whole_read_limit, WHOLE_READ_ROWS_MAX};
use ordo_core::{
    crash, ApplyContext, ApplyHandler, ConsumerStore, Drain, Envelope, FlowId, InboxFlow, Step,
    StoreError, Verdict,
};
use ordo_postgres::postgres::Row;
use ordo_postgres::{PgConsumer, PgProducer, PgProducerTx, PgTx};

use crate::rows::{corrupt, effect_record, flow_record, projection};
use crate::rules::{
    decide_advance, decide_apply, AdvanceDecision, AdvanceRefused, AdvanceRequest, ApplyOptions,
    FlowRecord, Projection,
};
use crate::sqlite::{
    advance_in_tx, Advance, AdvanceError, EffectRecord, FlowTx, ReservationConsumer,
    ReservationHandler, ReservationProducer,
};

impl ApplyHandler<PgTx> for ReservationHandler {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, PgTx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        self.apply_events(tx, std::slice::from_ref(event))
    }

    fn apply_all(
        &mut self,
        tx: &mut ApplyContext<'_, PgTx>,
        events: &[Envelope],
    ) -> Result<Option<Verdict>, StoreError> {
        self.apply_events(tx, events).map(Some)
    }

    fn reevaluate(&self) -> &[ordo_core::BlockCode] {
        ReservationHandler::reevaluate(self)
    }
}

impl ReservationHandler {
    /// Decides event by event in memory (`decide_apply`, as on SQLite),
    /// with the projections of every flow read in one statement and written
    /// in one, and the effects inserted in one; a single event goes the
    /// same way.
    fn apply_events(
        &mut self,
        cx: &mut ApplyContext<'_, PgTx>,
        events: &[Envelope],
    ) -> Result<Verdict, StoreError> {
        let tx: &PgTx = cx.tx();
        let flows: Vec<FlowKey<'_>> = events.iter().map(flow_key).collect();
        let stored = read_projections(tx, &flows)?;
        // Each flow's projection after the batch's events so far.
        let mut touched: BTreeMap<FlowKey<'_>, Projection> = BTreeMap::new();
        for event in events {
            let flow = flow_key(event);
            let current = touched
                .get(&flow)
                .or_else(|| stored.get(&owned(flow)))
                .cloned()
                .unwrap_or_else(|| Projection::empty_of(&event.inbox_flow()));
            let next = match decide_apply(&current, event, self.options()) {
                Ok(next) => next,
                Err(reason) => return Ok(Verdict::Block(reason)),
            };
            touched.insert(flow, next);
        }
        write_projections(tx, touched.values(), |p| {
            stored.contains_key(&(
                p.flow_id.as_str().to_owned(),
                p.producer.as_str().to_owned(),
            ))
        })?;
        crash::point(crash::CONSUMER_APPLY_AFTER_PROJECTION);
        let flows: Vec<&str> = events.iter().map(|e| e.flow_id.as_str()).collect();
        let producers: Vec<&str> = events.iter().map(|e| e.producer.as_str()).collect();
        let seqs: Vec<i64> = events.iter().map(|e| e.seq.get()).collect();
        let event_ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
        tx.execute(
            "INSERT INTO effect (flow_id, producer, seq, event_id)
             SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[])",
            &[&flows, &producers, &seqs, &event_ids],
        )?;
        crash::point(crash::CONSUMER_APPLY_AFTER_EFFECT);
        for event in events {
            self.record_webhook(cx, event)?;
        }
        Ok(Verdict::Apply)
    }
}

/// An inbox flow as `(flow_id, producer)`, the projection's key.
type FlowKey<'a> = (&'a str, &'a str);

/// The flow of `event`, as the projection's key.
fn flow_key(event: &Envelope) -> FlowKey<'_> {
    (event.flow_id.as_str(), event.producer.as_str())
}

/// `key`, owned.
fn owned((flow_id, producer): FlowKey<'_>) -> (String, String) {
    (flow_id.to_owned(), producer.to_owned())
}

/// The stored projections of `flows` (each once, however often named), by
/// `(flow_id, producer)`.
fn read_projections(
    tx: &PgTx,
    flows: &[FlowKey<'_>],
) -> Result<HashMap<(String, String), Projection>, StoreError> {
    let (flow_ids, producers): (Vec<&str>, Vec<&str>) = flows.iter().copied().unzip();
    tx.query(
        // `= ANY (ARRAY(SELECT unnest($1)))`: by the key's index whatever
        // the table's size (handed the array, the planner counts it and
        // scans a table of a few thousand rows whole instead).
        "SELECT flow_id, producer, state, quantity, applied_seq FROM projection
         WHERE flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
           AND (flow_id, producer) IN (SELECT * FROM unnest($1::text[], $2::text[]))",
        &[&flow_ids, &producers],
    )?
    .iter()
    .map(|row| {
        let key: (String, String) = (row.get(0), row.get(1));
        let stored = projection((&key.1, &key.0), row.get(2), row.get(3), row.get(4))?;
        Ok((key, stored))
    })
    .collect()
}

/// Writes `projections` (one per flow): see [`update_or_insert`]. The
/// applier holds each flow's apply cursor, so no other writes its
/// projection meanwhile.
fn write_projections<'a>(
    tx: &PgTx,
    projections: impl Iterator<Item = &'a Projection>,
    is_stored: impl Fn(&Projection) -> bool,
) -> Result<(), StoreError> {
    let statements = [
        "UPDATE projection p SET state = n.state, quantity = n.quantity,
             applied_seq = n.applied_seq
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[])
              AS n(flow_id, state, quantity, applied_seq, producer)
         WHERE p.flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
           AND p.flow_id = n.flow_id AND p.producer = n.producer",
        "INSERT INTO projection (flow_id, state, quantity, applied_seq, producer)
         SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[])",
    ];
    update_or_insert(
        projections,
        is_stored,
        statements,
        "consumer: projection",
        |sql, rows| {
            let (mut flows, mut states, mut quantities, mut seqs, mut producers) =
                (vec![], vec![], vec![], vec![], vec![]);
            for next in rows {
                let quantity = next.quantity.expect("an applied step has a quantity");
                flows.push(next.flow_id.as_str());
                states.push(next.state.as_str());
                quantities.push(quantity.get());
                seqs.push(next.applied_seq);
                producers.push(next.producer.as_str());
            }
            tx.execute(sql, &[&flows, &states, &quantities, &seqs, &producers])
        },
    )
}

/// Writes `rows` (one per flow): those `is_stored` (read by this
/// transaction) with the first of `statements`, the others with the
/// second, one statement each; `write` runs one on its rows and returns how
/// many it wrote, all of them or the tables were changed meanwhile. The
/// caller holds each flow (its head or apply cursor), so that no other
/// transaction writes these rows meanwhile: no `ON CONFLICT`, whose upsert
/// locks each row before updating it (a WAL record more) and probes the
/// key before each insert.
fn update_or_insert<'r, R: 'r>(
    rows: impl Iterator<Item = &'r R>,
    is_stored: impl Fn(&R) -> bool,
    statements: [&'static str; 2],
    context: &str,
    mut write: impl FnMut(&'static str, &[&'r R]) -> Result<u64, StoreError>,
) -> Result<(), StoreError> {
    let (updated, inserted): (Vec<&R>, Vec<&R>) = rows.partition(|r| is_stored(r));
    for (rows, sql) in [(updated, statements[0]), (inserted, statements[1])] {
        if rows.is_empty() {
            continue;
        }
        let written = write(sql, &rows)?;
        if written != rows.len() as u64 {
            return Err(corrupt(
                context,
                format!("{written} of {} rows written", rows.len()),
            ));
        }
    }
    Ok(())
}

/// The stored projection of one flow, empty if nothing was applied to it.
fn read_projection(tx: &PgTx, flow: &InboxFlow) -> Result<Projection, StoreError> {
    let key = (flow.flow_id.as_str(), flow.producer.as_str());
    Ok(read_projections(tx, &[key])?
        .remove(&owned(key))
        .unwrap_or_else(|| Projection::empty_of(flow)))
}

impl FlowTx for PgProducerTx<'_> {
    /// The flow with its head locked first: its last seq, then its row,
    /// read after the lock so that a writer that waited sees what the other
    /// committed (READ COMMITTED).
    fn flow(&mut self, flow_id: &FlowId) -> Result<FlowRecord, StoreError> {
        let last_seq = self.last_seq(flow_id)?;
        let row = self.sql().query_opt(
            "SELECT state, quantity FROM flow WHERE flow_id = $1",
            &[&flow_id.as_str()],
        )?;
        match row {
            None => Ok(FlowRecord {
                last_seq,
                ..FlowRecord::new_flow(flow_id.clone())
            }),
            Some(row) => flow_record(flow_id.as_str(), row.get(0), row.get(1), last_seq),
        }
    }

    fn write_step(&mut self, flow: &FlowRecord, event: &Envelope) -> Result<(), AdvanceError> {
        let quantity = flow.quantity.expect("a committed flow has a quantity");
        self.sql().execute(
            "INSERT INTO flow (flow_id, state, quantity) VALUES ($1, $2, $3)
             ON CONFLICT (flow_id) DO UPDATE SET state = excluded.state,
                 quantity = excluded.quantity",
            &[
                &flow.flow_id.as_str(),
                &flow.state.as_str(),
                &quantity.get(),
            ],
        )?;
        self.append_envelope(event)?;
        Ok(())
    }
}

/// Every request decided in order, each seeing the ones before it, as
/// [`advance_in_tx`] one after the other would, in a few statements
/// whatever their number: the heads locked and the flows read at once, the
/// decisions made in memory, then each changed flow written once and every
/// event appended at once.
#[allow(clippy::type_complexity)]
fn advance_all_in_tx(
    ptx: &mut PgProducerTx<'_>,
    requests: &[AdvanceRequest],
) -> Result<Vec<Result<Advance, AdvanceRefused>>, AdvanceError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let heads = ptx.last_seqs(requests.iter().map(|r| &r.flow_id))?;
    let names: Vec<&str> = heads.keys().map(String::as_str).collect();
    let mut flows: HashMap<String, FlowRecord> = HashMap::new();
    let mut stored: HashSet<String> = HashSet::new();
    for row in ptx.sql().query(
        // By the key's index, as `read_projections`.
        "SELECT flow_id, state, quantity FROM flow
         WHERE flow_id = ANY (ARRAY(SELECT unnest($1::text[])))",
        &[&names],
    )? {
        let flow: &str = row.get(0);
        let record = flow_record(flow, row.get(1), row.get(2), heads[flow])?;
        flows.insert(flow.to_owned(), record);
        stored.insert(flow.to_owned());
    }
    let mut outcomes = Vec::with_capacity(requests.len());
    let mut events = Vec::new();
    let producer = ptx.producer_name().clone();
    let mut changed: Vec<String> = Vec::new();
    for request in requests {
        let flow = request.flow_id.as_str();
        let current = flows.entry(flow.to_owned()).or_insert_with(|| FlowRecord {
            last_seq: heads[flow],
            ..FlowRecord::new_flow(request.flow_id.clone())
        });
        outcomes.push(match decide_advance(current, request) {
            Err(refused) => Err(refused),
            Ok(AdvanceDecision::Stale { last_seq }) => Ok(Advance::Stale { last_seq }),
            Ok(AdvanceDecision::InvalidTransition { from, to }) => {
                Ok(Advance::InvalidTransition { from, to })
            }
            Ok(AdvanceDecision::Commit { flow: next, event }) => {
                let event = Envelope {
                    producer: producer.clone(),
                    ..event
                };
                *current = next;
                if !changed.iter().any(|c| c == flow) {
                    changed.push(flow.to_owned());
                }
                events.push(event.clone());
                Ok(Advance::Committed(event))
            }
        });
    }
    let records = changed.iter().map(|flow| &flows[flow]);
    write_flows(ptx, records, &stored)?;
    ptx.append_envelopes(&events)?;
    Ok(outcomes)
}

/// Writes the flows `records`: see [`update_or_insert`]. Their heads are
/// locked, so no other writer changes or creates them meanwhile.
fn write_flows<'a>(
    ptx: &PgProducerTx<'_>,
    records: impl Iterator<Item = &'a FlowRecord>,
    stored: &HashSet<String>,
) -> Result<(), StoreError> {
    let statements = [
        "UPDATE flow f SET state = n.state, quantity = n.quantity
         FROM unnest($1::text[], $2::text[], $3::bigint[]) AS n(flow_id, state, quantity)
         WHERE f.flow_id = ANY (ARRAY(SELECT unnest($1::text[]))) AND f.flow_id = n.flow_id",
        "INSERT INTO flow (flow_id, state, quantity)
         SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
    ];
    update_or_insert(
        records,
        |r| stored.contains(r.flow_id.as_str()),
        statements,
        "producer: flow",
        |sql, rows| {
            let ids: Vec<&str> = rows.iter().map(|r| r.flow_id.as_str()).collect();
            let states: Vec<&str> = rows.iter().map(|r| r.state.as_str()).collect();
            let quantities: Vec<i64> = rows
                .iter()
                .map(|r| r.quantity.expect("a committed flow has a quantity").get())
                .collect();
            ptx.sql().execute(sql, &[&ids, &states, &quantities])
        },
    )
}

/// Whether the application's table `table` exists (a store of another
/// domain has none).
fn table_exists(tx: &PgTx, table: &str) -> Result<bool, StoreError> {
    Ok(tx
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])?
        .get(0))
}

/// Every row `sql` reads from the domain table `table` (`$1` is the row
/// count asked for), each through `convert`; none when the store has no
/// such table (a store of another domain).
fn read_table<T>(
    tx: &PgTx,
    table: &str,
    sql: &str,
    convert: impl FnMut(&Row) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    if !table_exists(tx, table)? {
        return Ok(Vec::new());
    }
    let rows = tx
        .query(sql, &[&whole_read_limit(WHOLE_READ_ROWS_MAX)])?
        .iter()
        .map(convert)
        .collect::<Result<Vec<_>, _>>()?;
    whole_read(table, WHOLE_READ_ROWS_MAX, rows)
}

/// Every flow of a reservation producer store, ordered by flow id.
pub fn pg_read_flows(tx: &PgTx) -> Result<Vec<FlowRecord>, StoreError> {
    let sql = format!(
        "SELECT f.flow_id, f.state, f.quantity, coalesce(h.last_seq, 0)
         FROM flow f LEFT JOIN \"{}\".outbox_head h ON h.flow_id = f.flow_id ORDER BY f.flow_id LIMIT $1",
        tx.ordo_schema()
    );
    read_table(tx, "flow", &sql, |row| {
        flow_record(row.get(0), row.get(1), row.get(2), row.get(3))
    })
}

/// Every projection, ordered by flow id.
pub fn pg_read_projections(tx: &PgTx) -> Result<Vec<Projection>, StoreError> {
    read_table(
        tx,
        "projection",
        "SELECT flow_id, producer, state, quantity, applied_seq FROM projection
         ORDER BY flow_id, producer LIMIT $1",
        |row| projection((row.get(1), row.get(0)), row.get(2), row.get(3), row.get(4)),
    )
}

/// Every effect, ordered by flow id then seq.
pub fn pg_read_effects(tx: &PgTx) -> Result<Vec<EffectRecord>, StoreError> {
    read_table(
        tx,
        "effect",
        "SELECT flow_id, producer, seq, event_id FROM effect
         ORDER BY flow_id, producer, seq LIMIT $1",
        |row| effect_record((row.get(1), row.get(0)), row.get(2), row.get(3)),
    )
}

/// The flows and the outbox of a reservation producer store, read in one
/// read transaction (no flows for a store of another domain), as
/// [`crate::producer_snapshot`] reads an SQLite file.
pub fn pg_producer_snapshot(
    producer: &mut PgProducer,
) -> Result<(Vec<FlowRecord>, Vec<ordo_core::OutboxRecord>), StoreError> {
    producer.read(|tx| Ok((pg_read_flows(tx)?, ordo_postgres::read_outbox(tx)?)))
}

/// The flows and the outbox with each row's custody (its one
/// destination's), read in one read transaction, as
/// [`crate::producer_snapshot_entries`] reads an SQLite file.
pub fn pg_producer_snapshot_entries(
    producer: &mut PgProducer,
) -> Result<(Vec<FlowRecord>, Vec<ordo_core::ops::OutboxEntry>), StoreError> {
    producer.read(|tx| Ok((pg_read_flows(tx)?, ordo_postgres::read_outbox_entries(tx)?)))
}

/// The inbox, the projections and the effects of a reservation consumer
/// store, read in one read transaction (no projections or effects for a
/// store of another domain), as [`crate::consumer_snapshot`] reads an
/// SQLite file.
pub fn pg_consumer_snapshot(
    consumer: &mut PgConsumer,
) -> Result<crate::sqlite::ConsumerRows, StoreError> {
    consumer.read(|tx| {
        Ok((
            ordo_postgres::read_inbox(tx)?,
            pg_read_projections(tx)?,
            pg_read_effects(tx)?,
        ))
    })
}

impl ReservationProducer for PgProducer {
    crate::methods::advance_methods!(advance_in_tx, advance_all_in_tx, pg_read_flows);
}

impl ReservationConsumer for PgConsumer {
    crate::methods::apply_methods!(pg_read_projections, read_projection, pg_read_effects);
}
