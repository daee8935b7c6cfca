//! Appends: the next seq of a flow and its outbox row, in the caller's
//! transaction.

use super::*;
use crate::columns::{create_flow_rows, EnvelopeColumns};

impl PgProducerTx<'_> {
    /// The transaction, for the caller's own reads and writes of its state.
    pub fn sql(&self) -> &PgTx {
        self.conn
    }

    /// [`OutboxTx::last_seq`] of several flows at once (each flow
    /// once), their head rows locked in flow id order, in two statements
    /// whatever their number (none for the heads this transaction locked
    /// already): keyed by flow id.
    pub fn last_seqs<'f>(
        &self,
        flows: impl IntoIterator<Item = &'f FlowId>,
    ) -> Result<HashMap<String, i64>, StoreError> {
        let mut names: Vec<&str> = flows.into_iter().map(FlowId::as_str).collect();
        names.sort_unstable();
        names.dedup();
        let mut locked = self.locked.borrow_mut();
        let new: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| !locked.contains_key(*name))
            .collect();
        if !new.is_empty() {
            locked.extend(self.lock_heads(&new)?);
        }
        Ok(names
            .iter()
            .map(|name| ((*name).to_owned(), locked[*name]))
            .collect())
    }

    /// Creates the heads of `names` (sorted, each once) that do not exist
    /// and locks them all; returns their last seqs.
    fn lock_heads(&self, names: &[&str]) -> Result<HashMap<String, i64>, StoreError> {
        let context = "producer: cannot lock the outbox head";
        create_flow_rows(self.conn, context, names)?;
        let heads: HashMap<String, i64> = self
            .conn
            .rows(context, LOCK_HEADS_SQL, &[&names])?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        match names.iter().find(|name| !heads.contains_key(**name)) {
            Some(missing) => Err(corrupt(context, format!("flow {missing} has no head row"))),
            None => Ok(heads),
        }
    }

    /// Appends envelopes the caller built, in order, as
    /// [`OutboxTx::append_envelope`] one after the other would, in a
    /// few statements whatever their number (arrays as parameters): the
    /// events before the first refusal are appended, and that refusal is
    /// returned (a caller that wants all or nothing rolls back, as
    /// [`ProducerStore::append_events`] does).
    pub fn append_envelopes(&mut self, events: &[Envelope]) -> Result<(), AppendError> {
        let context = "producer: cannot append to the outbox";
        if events.is_empty() {
            return Ok(());
        }
        for event in events {
            ordo_core::store::check_appended(event, self.producer_name)?;
        }
        let last = self.last_seqs(events.iter().map(|e| &e.flow_id))?;
        let (mut valid, mut refused) = first_not_next(events, last);
        let (inserted, used) = self.insert_outbox(context, &events[..valid])?;
        if let Some((used, id)) = used {
            // An event id in use comes before any later refusal.
            (valid, refused) = (used, Some(AppendError::EventIdUsed(id)));
        }
        let appended = &events[..valid];
        let (flows, firsts, lasts) = flow_ranges(appended);
        if !flows.is_empty() {
            let moved = self
                .conn
                .run(context, MOVE_HEADS_SQL, &[&flows, &firsts, &lasts])?;
            if moved != flows.len() as u64 {
                return Err(corrupt(
                    context,
                    format!(
                        "the heads of flows {flows:?} are not where this transaction locked them"
                    ),
                )
                .into());
            }
            let mut locked = self.locked.borrow_mut();
            for (flow, last) in flows.iter().zip(&lasts) {
                locked.insert((*flow).to_owned(), *last);
            }
            drop(locked);
            let inserted = &inserted[..valid];
            let positions: Vec<i64> = inserted.iter().map(|row| row.position).collect();
            let hand = if flows.len() == 1 {
                HAND_ONE_SQL
            } else {
                HAND_SQL
            };
            let given: HashMap<String, i64> = self
                .conn
                .rows(context, hand, &[&flows, &firsts, &lasts, &positions])?
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect();
            self.correct_waiting(context, appended, inserted, &given)?;
        }
        self.appended += appended.len() as u64;
        refused.map_or(Ok(()), Err)
    }

    /// Writes again the outbox rows of `appended` (inserted as `inserted`)
    /// whose flows were given to another number of destinations than the
    /// rows were inserted waiting for (`given`, by flow; a flow missing was
    /// given none): a destination added or a flow abandoned since.
    fn correct_waiting(
        &self,
        context: &str,
        appended: &[Envelope],
        inserted: &[InsertedRow],
        given: &HashMap<String, i64>,
    ) -> Result<(), StoreError> {
        let (positions, counts): (Vec<i64>, Vec<i64>) = appended
            .iter()
            .zip(inserted)
            .filter_map(|(event, row)| {
                let n = given.get(event.flow_id.as_str()).copied().unwrap_or(0);
                (n != row.waiting).then_some((row.position, n))
            })
            .unzip();
        if !positions.is_empty() {
            self.conn
                .run(context, WAITING_SQL, &[&positions, &counts, &self.now_ms])?;
        }
        Ok(())
    }

    /// Inserts `events` (each its flow's next, the heads locked) into the
    /// outbox in one statement ([`INSERT_OUTBOX_SQL`]); returns the rows
    /// inserted, in their order. When an event id is in use (or repeated
    /// in `events`), the first such event's index and id are returned too
    /// and nothing from it on stays inserted.
    fn insert_outbox(&self, context: &str, events: &[Envelope]) -> Result<Inserted, StoreError> {
        if events.is_empty() {
            return Ok((Vec::new(), None));
        }
        let columns = EnvelopeColumns::of(events.iter());
        let inserted: HashMap<(String, i64), InsertedRow> = self
            .conn
            .rows(context, INSERT_OUTBOX_SQL, &columns.params(&[&self.now_ms]))?
            .iter()
            .map(|row| {
                let inserted = InsertedRow {
                    position: row.get(2),
                    waiting: row.get(3),
                };
                ((row.get(0), row.get(1)), inserted)
            })
            .collect();
        let position_of = |e: &Envelope| {
            inserted
                .get(&(e.flow_id.as_str().to_owned(), e.seq.get()))
                .copied()
        };
        // The head is locked and each seq is past it: an insert that did
        // not happen is an event id in use.
        let Some(used) = events.iter().position(|e| position_of(e).is_none()) else {
            return Ok((events.iter().filter_map(position_of).collect(), None));
        };
        let is_in = |e: &Envelope| position_of(e).is_some();
        let (flows, seqs): (Vec<&str>, Vec<i64>) = events[used..]
            .iter()
            .filter(|e| is_in(e))
            .map(|e| (e.flow_id.as_str(), e.seq.get()))
            .unzip();
        if !flows.is_empty() {
            self.conn.run(
                context,
                "DELETE FROM {s}.outbox o USING unnest($1::text[], $2::bigint[]) AS d(flow_id, seq)
                 WHERE o.flow_id = d.flow_id AND o.seq = d.seq",
                &[&flows, &seqs],
            )?;
        }
        let kept = events[..used].iter().filter_map(position_of).collect();
        Ok((kept, Some((used, events[used].event_id.clone()))))
    }
}

/// The rows an insert kept, in their events' order, and the index and id
/// of the first event whose id was in use, if one was.
type Inserted = (Vec<InsertedRow>, Option<(usize, EventId)>);

/// An outbox row as inserted: its position and the number of destinations
/// it waits for.
#[derive(Debug, Clone, Copy)]
struct InsertedRow {
    position: i64,
    waiting: i64,
}

impl OutboxTx for PgProducerTx<'_> {
    fn producer_name(&self) -> &ProducerName {
        self.producer_name
    }

    /// With the flow's head row locked until the transaction ends: a
    /// concurrent writer of the same flow waits here, then reads the seq
    /// this one committed (READ COMMITTED), so that it finds itself stale.
    fn last_seq(&self, flow_id: &FlowId) -> Result<i64, StoreError> {
        Ok(self.last_seqs([flow_id])?[flow_id.as_str()])
    }

    fn now_ms(&self) -> i64 {
        self.now_ms
    }

    fn append_envelope(&mut self, event: &Envelope) -> Result<(), AppendError> {
        self.append_envelopes(std::slice::from_ref(event))
    }
}

/// How many of `events` come each at its flow's last seq plus one (`last`,
/// moved along as they are met), and the refusal of the first that does
/// not.
fn first_not_next(
    events: &[Envelope],
    mut last: HashMap<String, i64>,
) -> (usize, Option<AppendError>) {
    for (i, event) in events.iter().enumerate() {
        let last_seq = last[event.flow_id.as_str()];
        if last_seq.checked_add(1) != Some(event.seq.get()) {
            let refused = AppendError::NotNext {
                flow_id: event.flow_id.clone(),
                seq: event.seq,
                last_seq,
            };
            return (i, Some(refused));
        }
        last.insert(event.flow_id.as_str().to_owned(), event.seq.get());
    }
    (events.len(), None)
}

/// Each flow's first and last seq among `events`, by flow id.
fn flow_ranges(events: &[Envelope]) -> (Vec<&str>, Vec<i64>, Vec<i64>) {
    let mut ranges: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for event in events {
        let seq = event.seq.get();
        ranges
            .entry(event.flow_id.as_str())
            .and_modify(|range| range.1 = seq)
            .or_insert((seq, seq));
    }
    let (flows, seqs): (Vec<&str>, Vec<(i64, i64)>) = ranges.into_iter().unzip();
    let (firsts, lasts) = seqs.into_iter().unzip();
    (flows, firsts, lasts)
}
