//! The store traits every backend implements, and the pure decisions the
//! backends run inside their transactions.

use std::collections::BTreeSet;

use crate::backoff::Backoff;
use crate::destination::{
    AbandonRequest, Destination, DestinationRefused, DestinationStart, ProducerRepair,
};
use crate::envelope::{Envelope, Headers};
use crate::error::ErrorKind;
use crate::error::{AppendError, StoreError};
use crate::handler::ApplyHandler;
use crate::identity::StoreId;
use crate::ids::{
    BlockCode, DestinationName, EventId, FlowId, InboxFlow, ProducerName, SchemaVersion, Seq,
};
use crate::ops::{
    whole_read, ConsumerFlow, ConsumerStatus, InboxEntry, InboxScope, OutboxEntry, ProducerFlow,
    ProducerStatus, Pruned, RepairRecord, RetryRefused, SkipRefused, SkipRequest,
    WHOLE_READ_ROWS_MAX,
};
use crate::outcome::{
    Answer, BlockReason, Drain, DrainStop, InboxRecord, InboxStatus, OutboxRecord, Receipt, Step,
};
use crate::trace::TraceParent;

pub use crate::receive::{
    decide_and_store, decide_batch, decide_receive, Delivery, ReceiveRows, StoredIdentities,
};

/// Which side a store belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The producer store: the outbox beside the application's tables.
    Producer,
    /// The consumer store: the inbox beside the application's tables.
    Consumer,
}

impl Role {
    /// `producer` or `consumer`, as errors and the stores' metadata say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Consumer => "consumer",
        }
    }

    /// Refuses a store whose recorded role (`stored`, if any) is not this
    /// one, as [`ErrorKind::Incompatible`]: `refusal` words the error from
    /// the role found (`unknown` when none is recorded).
    pub fn check_stored(
        self,
        stored: Option<&str>,
        refusal: impl FnOnce(&str) -> String,
    ) -> Result<(), StoreError> {
        if stored == Some(self.as_str()) {
            return Ok(());
        }
        Err(StoreError::new(
            ErrorKind::Incompatible,
            refusal(stored.unwrap_or("unknown")),
        ))
    }
}

/// How many flows one page of [`ConsumerStore::flows_with_work`] lists.
pub const FLOWS_PAGE_LEN: usize = 1_024;

/// A row count as an SQL `LIMIT` (a count past `i64::MAX` saturates).
pub fn sql_limit(rows: usize) -> i64 {
    i64::try_from(rows).unwrap_or(i64::MAX)
}

/// One page of [`ConsumerStore::flows_with_work`]: up to `limit` flows
/// after `after` (`""` for the first page). A backend reads the flows with
/// a pending row and those with a row blocked with a re-evaluated code,
/// each as a range read from `after` stopping at `limit`; the page merges
/// them.
#[derive(Debug, Clone, Copy)]
pub struct WorkPage<'a> {
    /// The last flow of the page before, `(flow id, producer)`, or
    /// `("", "")`: a page reads the flows past it in `(flow_id, producer)`
    /// order.
    pub after: (&'a str, &'a str),
    /// How many flows at the most.
    pub limit: usize,
}

impl<'a> WorkPage<'a> {
    /// The page after `after` (the first page for `None`).
    pub fn new(after: Option<&'a InboxFlow>, limit: usize) -> WorkPage<'a> {
        WorkPage {
            after: after.map_or(("", ""), |f| (f.flow_id.as_str(), f.producer.as_str())),
            limit,
        }
    }

    /// The limit as an SQL parameter.
    pub fn limit_sql(&self) -> i64 {
        sql_limit(self.limit)
    }

    /// The page: the `pending` flows and the re-evaluated `blocked` ones
    /// (each list in flow order, at most `limit`), merged in flow order,
    /// each once, at most `limit`.
    pub fn merged(&self, mut pending: Vec<InboxFlow>, blocked: Vec<InboxFlow>) -> Vec<InboxFlow> {
        assert!(pending.len() <= self.limit && blocked.len() <= self.limit);
        if !blocked.is_empty() {
            pending.extend(blocked);
            pending.sort_unstable();
            pending.dedup();
            pending.truncate(self.limit);
        }
        debug_assert!(
            pending.windows(2).all(|w| w[0] < w[1]),
            "a page is in flow order"
        );
        pending
    }
}

/// One page of a flow listing (the console's flow list): up to `limit`
/// flows whose id starts with `prefix`, after `after`, in flow id order.
/// A backend reads it as one indexed range and hands back the rows; the
/// page itself is decided here.
#[derive(Debug, Clone, Copy)]
pub struct FlowsPage<'a> {
    /// What every flow id on the page starts with.
    pub prefix: &'a str,
    /// The last flow of the page before, if any.
    pub after: Option<&'a FlowId>,
    /// On a consumer's page, the producer of the last flow of the page
    /// before (`""` for none): its range takes `(flow_id, producer)` pairs
    /// above `(after, after_producer)`.
    pub after_producer: &'a str,
    /// How many flows at the most.
    pub limit: usize,
}

impl<'a> FlowsPage<'a> {
    /// The range read's parameters `(start, after, limit)`: the range
    /// starts at `start`, the later of `prefix` and `after` (so that a deep
    /// page starts there, not at the prefix), takes ids above `after` (""
    /// for the first page), and at most `limit` rows.
    pub fn bounds(&self) -> (&'a str, &'a str, i64) {
        let after = self.after.map_or("", FlowId::as_str);
        let limit = sql_limit(self.limit);
        (self.prefix.max(after), after, limit)
    }

    /// The page from the rows its range read returned in flow order (each
    /// a stored flow id and the number beside it): the first row past the
    /// prefix ends it; a stored id that is no flow id is a corrupt store.
    pub fn of_rows(
        &self,
        context: &str,
        rows: Vec<(String, i64)>,
    ) -> Result<Vec<(FlowId, i64)>, StoreError> {
        assert!(rows.len() <= self.limit, "a page holds at most its limit");
        rows.into_iter()
            .take_while(|(flow_id, _)| flow_id.starts_with(self.prefix))
            .map(|(flow_id, n)| {
                let flow_id = FlowId::new(flow_id)
                    .map_err(|e| StoreError::corrupt(&format!("{context}: stored flow"), e))?;
                Ok((flow_id, n))
            })
            .collect()
    }

    /// The producer's page from its rows `(flow id, last seq)`.
    pub fn producer_flows(
        &self,
        rows: Vec<(String, i64)>,
    ) -> Result<Vec<ProducerFlow>, StoreError> {
        self.of_rows("producer", rows)?
            .into_iter()
            .map(|(flow_id, last_seq)| {
                let last_seq = Seq::new(last_seq)
                    .map_err(|e| StoreError::corrupt("producer: stored flow", e))?;
                Ok(ProducerFlow { flow_id, last_seq })
            })
            .collect()
    }

    /// The consumer's page from its rows `(flow id, producer, applied
    /// seq)`.
    pub fn consumer_flows(
        &self,
        rows: Vec<(String, String, i64)>,
    ) -> Result<Vec<ConsumerFlow>, StoreError> {
        let (producers, rows): (Vec<String>, Vec<(String, i64)>) = rows
            .into_iter()
            .map(|(flow_id, producer, seq)| (producer, (flow_id, seq)))
            .unzip();
        let flows = self.of_rows("consumer", rows)?;
        flows
            .into_iter()
            .zip(producers)
            .map(|((flow_id, applied_seq), producer)| {
                Ok(ConsumerFlow {
                    producer: stored_producer(&producer)?,
                    flow_id,
                    applied_seq: u64::try_from(applied_seq).unwrap_or(0),
                })
            })
            .collect()
    }
}

/// The operator's view of a producer store: the outbox's reads and
/// repairs, which need no transaction of the application's. Object-safe:
/// `Box<dyn ProducerStore + Send>` (which includes it) is a producer store
/// of any backend, and `&mut dyn ProducerOps` the console's view of one.
pub trait ProducerOps {
    /// The domain that owns the store.
    fn domain(&self) -> &str;

    /// The store's identity, fixed when it was created.
    fn store_id(&self) -> &StoreId;

    /// The producer's name, set when the store was created
    /// ([`ProducerName::DEFAULT`] for a store of an earlier release).
    fn producer_name(&self) -> &ProducerName;

    /// Every outbox row, in commit order.
    fn outbox(&mut self) -> Result<Vec<OutboxRecord>, StoreError>;

    /// One outbox row by event id.
    fn outbox_event(&mut self, event_id: &EventId) -> Result<Option<OutboxRecord>, StoreError>;

    /// Outbox rows with their delivery bookkeeping, in commit order, only the
    /// quarantined ones if asked, at most `limit`.
    fn outbox_entries(
        &mut self,
        quarantined_only: bool,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError>;

    /// Clears an event's quarantine so that the relay tries it once more.
    fn retry_quarantined(
        &mut self,
        event_id: &EventId,
    ) -> Result<Result<(), RetryRefused>, StoreError>;

    /// The producer's alerting signals at `now_ms`.
    fn producer_status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError>;

    /// Removes accepted outbox rows accepted before `cutoff_ms`. Seq
    /// allocation is unaffected: each flow's last seq is kept apart.
    fn prune_outbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError>;

    /// Up to `limit` flows whose id starts with `prefix`, after `after`,
    /// ordered by flow id: an indexed range read, however many flows there
    /// are (the console's flow list).
    fn producer_flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ProducerFlow>, StoreError>;

    /// The flow's outbox rows with their delivery bookkeeping, in seq
    /// order, at most `limit`.
    fn flow_outbox_entries(
        &mut self,
        flow_id: &FlowId,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError>;

    /// Every destination, by name, with its own signals at `now_ms`.
    fn destinations(&mut self, now_ms: i64) -> Result<Vec<Destination>, StoreError>;

    /// Adds a destination (PROTOCOL.md section 12): it receives every flow
    /// from seq 1 (`Start`, refused while an early event of one was pruned)
    /// or the flows whose seq 1 commits after it (`Now`).
    fn add_destination(
        &mut self,
        name: &DestinationName,
        from: DestinationStart,
    ) -> Result<Result<(), DestinationRefused>, StoreError>;

    /// Removes a destination and its custody (never the last one), audited
    /// in the producer's repair log in the same transaction.
    fn remove_destination(
        &mut self,
        name: &DestinationName,
        by: &str,
        reason: &str,
    ) -> Result<Result<(), DestinationRefused>, StoreError>;

    /// Abandons a flow for one destination (PROTOCOL.md section 12), in one
    /// transaction: its events that destination does not hold, from the
    /// lowest such seq on, and every event appended to it later, are never
    /// delivered there, count as held for pruning, and leave that
    /// destination's quarantine; audited in the producer's repair log,
    /// whose new row is returned. Refused, writing nothing, for an unknown
    /// destination or flow, a flow not delivered to that destination, or
    /// one already abandoned there.
    fn abandon_flow(
        &mut self,
        request: &AbandonRequest,
    ) -> Result<Result<ProducerRepair, DestinationRefused>, StoreError>;

    /// The producer's audit log, oldest first.
    fn producer_repairs(&mut self) -> Result<Vec<ProducerRepair>, StoreError>;

    /// Chooses the destination that the relay's reads and bookkeeping and
    /// [`retry_quarantined`](ProducerOps::retry_quarantined) act on from now
    /// on; `None` chooses the store's only one (refused when it has
    /// several). Until a choice, a store acts on its only destination.
    fn use_destination(
        &mut self,
        name: Option<&DestinationName>,
    ) -> Result<Result<(), DestinationRefused>, StoreError>;
}

/// The producer side: the outbox. The application's own state lives beside
/// it in the same store and changes in the same transactions (see the
/// backend's write API, such as `ordo_sqlite::ProducerDb::write`).
///
/// Its own methods are the producer's writes: append, and the relay's
/// reads of what to hand over with their bookkeeping. Object-safe.
pub trait ProducerStore: ProducerOps {
    /// Appends `events` to the outbox in ONE write transaction: each event's
    /// seq must be its flow's last committed seq plus one (events of one
    /// flow in seq order), and its event id unused. Any refusal writes
    /// nothing. For applications that build their own envelopes; the
    /// backend's write API also allocates seqs and ids.
    fn append_events(&mut self, events: &[Envelope]) -> Result<(), AppendError>;

    /// Up to `limit` events not yet accepted, oldest commit first.
    fn pending(&mut self, limit: usize) -> Result<Vec<Envelope>, StoreError>;

    /// The oldest event not yet accepted, quarantined or not, if its next
    /// attempt is due at `now_ms` (the `first-pending` policy).
    fn oldest_unaccepted(&mut self, now_ms: i64) -> Result<Option<Envelope>, StoreError>;

    /// Up to `limit` events for one fair round: the head of each flow (its
    /// lowest seq neither accepted nor quarantined) whose next attempt is due,
    /// flows served least recently first, none of the `skip` flows.
    ///
    /// A store shared by several relays returns only flows this relay
    /// holds: it claims them here, and refuses the round's bookkeeping
    /// ([`ErrorKind::LeaseLost`]) when another
    /// relay claimed one of them since. A store with one relay (an SQLite
    /// file) needs no claims.
    fn fair_round(
        &mut self,
        limit: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.fair_round_deep(limit, 1, skip, now_ms)
    }

    /// [`fair_round`](ProducerStore::fair_round) taking up to
    /// `flow_events_max` events of each flow: its head and the events
    /// after it not accepted nor quarantined, in seq order, all due when the
    /// head is; still at most `limit` in all, flows in the relay's order. A
    /// round then costs its per-flow bookkeeping once for several events.
    /// A store may hand fewer of a flow, down to its head alone; with
    /// `flow_events_max` 1 it hands the heads alone.
    fn fair_round_deep(
        &mut self,
        limit: usize,
        flow_events_max: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError>;

    /// Records the receipts of one round in one transaction: `accepted` and
    /// `duplicate` mark the event accepted; `conflict` quarantines it with
    /// its reason (never accepted). Each event's attempts and last outcome
    /// are updated.
    ///
    /// The acceptance time recorded is the later of `now_ms` and the store's
    /// clock read under the write lock, so acceptances are stamped in
    /// commit order across relays.
    ///
    /// This is delivery bookkeeping, a hint: the consumer's durable receive
    /// is what counts. A store may commit it without waiting for the disk,
    /// provided a lost commit is lost whole and every later durable commit
    /// makes it durable too (a lost mark makes the relay hand the event
    /// over again, and the consumer answers `duplicate`).
    fn record_receipts(
        &mut self,
        receipts: &[(EventId, Receipt)],
        now_ms: i64,
    ) -> Result<(), StoreError>;

    /// [`record_receipts`](ProducerStore::record_receipts) of receipts
    /// returned by the consumer store `consumer` (`None`: unknown). At the
    /// destination's first delivery from a known consumer the store records
    /// that identity in the same transaction; a later delivery from another
    /// consumer is refused whole (nothing marked), with the error of
    /// [`check_consumer`](crate::destination::check_consumer)
    /// (PROTOCOL.md section 12). The default, for a store that keeps no
    /// identity, records the receipts alone.
    fn record_receipts_from(
        &mut self,
        consumer: Option<&StoreId>,
        receipts: &[(EventId, Receipt)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let _ = consumer;
        self.record_receipts(receipts, now_ms)
    }

    /// Refuses, before a delivery, a consumer store other than the one the
    /// destination the relay acts on recorded at its first delivery, so
    /// that nothing of the round reaches it; records nothing (the first
    /// delivery's receipts do). The default, for a store that keeps no
    /// identity, accepts any.
    fn check_consumer(&mut self, consumer: &StoreId) -> Result<(), StoreError> {
        let _ = consumer;
        Ok(())
    }

    /// The consumer store the destination the relay acts on recorded at
    /// its first delivery, if any: the relay asks the transport for the
    /// consumer's identity before a delivery only then (nothing is
    /// enforced before the first one). The default keeps none.
    fn recorded_consumer(&mut self) -> Result<Option<StoreId>, StoreError> {
        Ok(None)
    }

    /// Records a transient delivery failure of these events: attempts, the
    /// error, and a next attempt time drawn from `backoff`: `now_ms + 1 +
    /// delay`, saturating at `i64::MAX` (a relay whose clock reads
    /// `i64::MAX` finds it due; it never wraps into the past).
    fn record_failure(
        &mut self,
        event_ids: &[EventId],
        error: &str,
        now_ms: i64,
        backoff: &Backoff,
    ) -> Result<(), StoreError>;

    /// Quarantines one event the consumer refused to store (the relay's
    /// `too_large` or `rejected_by_consumer`): never accepted, never retried
    /// automatically, like a conflict. `outcome` is the short code recorded
    /// as its last outcome, `reason` the full text. An event already
    /// accepted, or no longer in the outbox, is left as it is.
    fn quarantine(
        &mut self,
        event_id: &EventId,
        outcome: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), StoreError>;
}

/// The producer name a store records at `place`, checked:
/// [`ProducerName::DEFAULT`] when it records none (a store of an earlier
/// release); a recorded value that is no producer name is a corrupt store.
pub fn stored_producer_name(
    place: &str,
    stored: Option<String>,
) -> Result<ProducerName, StoreError> {
    match stored {
        None => Ok(ProducerName::default()),
        Some(name) => ProducerName::new(name)
            .map_err(|e| StoreError::corrupt(&format!("{place}: producer name"), e)),
    }
}

/// The producer of a stored inbox row, fingerprint, cursor or repair: a
/// value that is no producer name is a corrupt store.
pub fn stored_producer(name: &str) -> Result<ProducerName, StoreError> {
    ProducerName::new(name).map_err(|e| StoreError::corrupt("consumer: stored producer", e))
}

/// Refuses to open the producer store at `place`, named `stored`, under
/// another name than `wanted`: a producer's name is set when its store is
/// created and never changes.
pub fn check_producer_name(
    place: &str,
    stored: &ProducerName,
    wanted: &ProducerName,
) -> Result<(), StoreError> {
    if wanted == stored {
        return Ok(());
    }
    Err(StoreError::new(
        ErrorKind::Incompatible,
        format!(
            "{place} is the producer store named \"{stored}\", not \"{wanted}\": a producer's name is set when its store is created and never changes"
        ),
    ))
}

/// Refuses to append an envelope that names another producer than the
/// store's `name` (an envelope a caller built for another store), or whose
/// headers break their rules: every body a producer store holds names
/// that store and parses again.
pub fn check_appended(event: &Envelope, name: &ProducerName) -> Result<(), AppendError> {
    crate::envelope::check_headers(&event.headers).map_err(|rule| {
        AppendError::Invalid(format!("event {}: headers: {rule}", event.event_id))
    })?;
    if &event.producer == name {
        return Ok(());
    }
    Err(AppendError::Invalid(format!(
        "event {} names producer \"{}\", but this is the producer store named \"{name}\"",
        event.event_id, event.producer
    )))
}

/// A producer's write transaction, as an application appends to the outbox
/// through it (each backend's own: `ordo_sqlite::ProducerTx`,
/// `ordo_postgres::PgProducerTx`). The backend reads a flow's last seq and
/// writes an envelope; the protocol's append is written here once.
pub trait OutboxTx {
    /// The seq of the flow's last committed event, 0 if it has none.
    fn last_seq(&self, flow_id: &FlowId) -> Result<i64, StoreError>;

    /// The time this transaction records on what it writes, in
    /// milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// The name of the store's producer, written into every envelope
    /// [`OutboxTx::append`] builds (left out of the body for the default).
    fn producer_name(&self) -> &ProducerName;

    /// Appends an envelope the caller built, with its own event id, to the
    /// outbox in this transaction. Its seq must be exactly the flow's
    /// [`OutboxTx::last_seq`] plus one, so a flow's seqs stay contiguous,
    /// and its event id unused; anything else is refused without writing,
    /// and the transaction can go on.
    fn append_envelope(&mut self, event: &Envelope) -> Result<(), AppendError>;

    /// Appends the flow's next event to the outbox in this transaction, and
    /// returns it: its seq is the flow's last committed seq plus one, its id
    /// [`EventId::for_seq`] (`FLOW-SEQ`, or `h` and a hash when that would
    /// pass 100 characters), its payload `payload` serialized to a JSON
    /// object, its `producer` the store's name. The application's own
    /// writes in the same transaction commit with it or not at all.
    ///
    /// A payload that does not serialize to a JSON object, or an event type
    /// breaking the envelope's rules, is refused ([`AppendError::Invalid`])
    /// and nothing is written.
    fn append<T: serde::Serialize + ?Sized>(
        &mut self,
        flow_id: &FlowId,
        event_type: &str,
        schema_version: SchemaVersion,
        payload: &T,
    ) -> Result<Envelope, AppendError>
    where
        Self: Sized,
    {
        let no_headers = Headers::new();
        self.append_with_headers(flow_id, event_type, schema_version, payload, &no_headers)
    }

    /// [`OutboxTx::append`] with the event's W3C trace context: the header
    /// `traceparent`, part of its body (PROTOCOL.md section 12). `None`
    /// appends without one (with the `otel` feature: with the current
    /// OpenTelemetry context's, when there is one).
    fn append_traced<T: serde::Serialize + ?Sized>(
        &mut self,
        flow_id: &FlowId,
        event_type: &str,
        schema_version: SchemaVersion,
        payload: &T,
        traceparent: Option<&TraceParent>,
    ) -> Result<Envelope, AppendError>
    where
        Self: Sized,
    {
        let headers = crate::trace::appended_headers(&Headers::new(), traceparent);
        self.append_with_headers(flow_id, event_type, schema_version, payload, &headers)
    }

    /// [`OutboxTx::append`] with the event's `headers` (correlation ids, a
    /// W3C `traceparent`): part of its body. Headers breaking their rules
    /// ([`check_headers`](crate::envelope::check_headers)) are refused
    /// ([`AppendError::Invalid`]) and nothing is written. With the `otel`
    /// feature, headers without a `traceparent` get the current
    /// OpenTelemetry context's, when there is one.
    fn append_with_headers<T: serde::Serialize + ?Sized>(
        &mut self,
        flow_id: &FlowId,
        event_type: &str,
        schema_version: SchemaVersion,
        payload: &T,
        headers: &Headers,
    ) -> Result<Envelope, AppendError>
    where
        Self: Sized,
    {
        let headers = &crate::trace::appended_headers(headers, None);
        crate::envelope::check_headers(headers)
            .map_err(|rule| AppendError::Invalid(format!("headers: {rule}")))?;
        let last_seq = self.last_seq(flow_id)?;
        let mut event =
            crate::append::next_event(flow_id, last_seq, event_type, schema_version, payload)?;
        event.producer = self.producer_name().clone();
        event.headers = headers.clone();
        self.append_envelope(&event)?;
        assert_eq!(
            event.seq.get(),
            last_seq + 1,
            "an append takes the next seq"
        );
        Ok(event)
    }
}

/// The consumer's durable receive: what a transport calls (in process, or
/// the inbox behind HTTP). Object-safe.
pub trait Receive {
    /// Stores envelopes delivered by the producer store `sender` (`None`:
    /// unknown) durably in one transaction and returns one answer per
    /// envelope, in input order (a conflict's names the held event). Never
    /// changes the application's tables. Within a batch, a later envelope
    /// sees the earlier ones, and nothing of a flow is stored after one of
    /// its envelopes conflicted ([`Delivery`]). Each stored row keeps
    /// `sender`, so that a conflict with a row of the same sender is told
    /// apart as [`Receipt::ProducerRewound`].
    fn receive_from(
        &mut self,
        sender: Option<&StoreId>,
        envelopes: &[Envelope],
    ) -> Result<Vec<Answer>, StoreError>;

    /// [`Receive::receive_from`] an unknown sender.
    fn receive_answers(&mut self, envelopes: &[Envelope]) -> Result<Vec<Answer>, StoreError> {
        self.receive_from(None, envelopes)
    }

    /// [`Receive::receive_answers`]' receipts alone.
    fn receive_batch(&mut self, envelopes: &[Envelope]) -> Result<Vec<Receipt>, StoreError> {
        let answers = self.receive_answers(envelopes)?;
        Ok(answers.into_iter().map(|a| a.receipt).collect())
    }

    /// [`Receive::receive_batch`] for one envelope.
    fn receive(&mut self, envelope: &Envelope) -> Result<Receipt, StoreError> {
        let receipts = self.receive_batch(std::slice::from_ref(envelope))?;
        assert_eq!(receipts.len(), 1, "one receipt per envelope");
        Ok(receipts[0])
    }
}

/// The operator's view of a consumer store: the inbox's reads and repairs
/// (list, reopen, skip, prune, status). Object-safe, with [`Receive`]
/// beside it in [`ConsumerHandle`]: a consumer store of any backend, as the
/// command line, the console and the inbox server see it.
pub trait ConsumerOps {
    /// The domain that owns the store.
    fn domain(&self) -> &str;

    /// The store's identity, fixed when it was created.
    fn store_id(&self) -> &StoreId;

    /// Every inbox row, ordered by flow id then seq.
    fn inbox(&mut self) -> Result<Vec<InboxRecord>, StoreError>;

    /// Inbox rows with their times, ordered by flow then seq, only blocked
    /// ones and only one producer's or one flow's if asked, at most `limit`.
    fn inbox_entries(
        &mut self,
        blocked_only: bool,
        scope: InboxScope<'_>,
        limit: usize,
    ) -> Result<Vec<InboxEntry>, StoreError>;

    /// Sets the flow's blocked rows back to pending so that apply evaluates
    /// them again; returns how many.
    fn reopen_blocked(&mut self, flow: &InboxFlow) -> Result<u64, StoreError>;

    /// Marks the flow's next stored event `skipped` (no effect), moves the
    /// flow past it and appends the decision to the repair log, in one
    /// transaction.
    /// The decision's time is the store's clock, read under the write lock.
    fn skip(
        &mut self,
        request: &SkipRequest,
    ) -> Result<Result<RepairRecord, SkipRefused>, StoreError>;

    /// The append-only repair log, oldest first.
    fn repairs(&mut self) -> Result<Vec<RepairRecord>, StoreError>;

    /// The consumer's alerting signals.
    fn consumer_status(&mut self) -> Result<ConsumerStatus, StoreError>;

    /// Removes applied and skipped inbox rows settled before `cutoff_ms`,
    /// keeping for each a fingerprint (flow, seq, event id, body hash) and
    /// per flow a watermark, so that a redelivery is still `duplicate` or
    /// `conflict` and no old seq is ever applied again.
    fn prune_inbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError>;

    /// Up to `limit` flows the inbox knows (stored rows or an apply
    /// cursor) whose id starts with `prefix`, after `after`, ordered by
    /// flow id then producer: an indexed range read, however many flows
    /// there are.
    fn consumer_flows_page(
        &mut self,
        prefix: &str,
        after: Option<&InboxFlow>,
        limit: usize,
    ) -> Result<Vec<ConsumerFlow>, StoreError>;

    /// The inbox row stored at the flow's `seq`, if any.
    fn inbox_entry_at(
        &mut self,
        flow: &InboxFlow,
        seq: Seq,
    ) -> Result<Option<InboxEntry>, StoreError>;

    /// The inbox row stored under `producer`'s `event_id`, wherever its
    /// flow and seq, if any. A pruned row keeps only its fingerprint:
    /// `None`.
    fn inbox_entry_of_event(
        &mut self,
        producer: &ProducerName,
        event_id: &EventId,
    ) -> Result<Option<InboxEntry>, StoreError>;
}

/// The consumer side: the inbox, the per-flow apply cursor, and the
/// application's own tables beside them, written by its [`ApplyHandler`].
///
/// Its own methods are the apply side, generic over the handler and so not
/// object-safe: apply runs on a concrete backend, whose transaction type
/// the handler writes through.
pub trait ConsumerStore: Receive + ConsumerOps {
    /// The transaction a handler writes in (for SQLite,
    /// `rusqlite::Connection` inside an open write transaction).
    type Tx: ?Sized;

    /// Looks only at `(flow_id, applied_seq + 1)` and applies it through
    /// `handler`, blocks it, or reports `gap` or `idle`. An application
    /// commits the handler's writes and the inbox mark in one transaction.
    fn apply_next_with<H>(&mut self, flow: &InboxFlow, handler: &mut H) -> Result<Step, StoreError>
    where
        H: ApplyHandler<Self::Tx> + ?Sized;

    /// Drains the given flows, in order, each up to its own limit (`None`: no
    /// limit), in ONE transaction applying at most `events_max` events in
    /// all through `handler`, strictly in order per flow. Returns one drain
    /// per visited flow; when `events_max` runs out, the flow in progress
    /// stops with `limit` and later flows are not visited.
    fn apply_batch_with<H>(
        &mut self,
        flows: &[(InboxFlow, Option<u64>)],
        events_max: u64,
        handler: &mut H,
    ) -> Result<Vec<Drain>, StoreError>
    where
        H: ApplyHandler<Self::Tx> + ?Sized;

    /// Flows with a `pending` row, or with a row blocked with one of the
    /// `reevaluate` codes, ordered by flow id. A flow whose next event is
    /// blocked or missing is listed too when a later row is pending: apply
    /// then reports `blocked` or `gap` for it, and writes nothing. Read a
    /// page of [`FLOWS_PAGE_LEN`] flows at a time, at most
    /// [`WHOLE_READ_ROWS_MAX`] flows in all ([`process_all`] reads a page at
    /// a time instead, however many there are).
    fn flows_with_work(&mut self, reevaluate: &[BlockCode]) -> Result<Vec<InboxFlow>, StoreError> {
        let mut all = Vec::new();
        let mut after: Option<InboxFlow> = None;
        loop {
            let page = self.flows_with_work_page(after.as_ref(), FLOWS_PAGE_LEN, reevaluate)?;
            let Some(last) = page.last().cloned() else {
                return Ok(all);
            };
            debug_assert!(
                after.as_ref().is_none_or(|a| *a < last),
                "pages move forward"
            );
            all.extend(page);
            if all.len() > WHOLE_READ_ROWS_MAX {
                return whole_read("the list of flows with work", WHOLE_READ_ROWS_MAX, all);
            }
            after = Some(last);
        }
    }

    /// Up to `limit` of [`ConsumerStore::flows_with_work`] after `after`.
    fn flows_with_work_page(
        &mut self,
        after: Option<&InboxFlow>,
        limit: usize,
        reevaluate: &[BlockCode],
    ) -> Result<Vec<InboxFlow>, StoreError>;
}

/// A consumer store of any backend, behind one object-safe type: receive,
/// the operator's view, and its effect intents. Every [`ConsumerStore`]
/// that keeps intents and is `Send` is one.
pub trait ConsumerHandle: Receive + ConsumerOps + crate::effect::EffectOps + Send {}

impl<S: Receive + ConsumerOps + crate::effect::EffectOps + Send + ?Sized> ConsumerHandle for S {}

/// The default number of events applied per transaction.
pub const APPLY_BATCH_LEN_DEFAULT: u64 = 256;
/// How many flows [`process_all`] lists at a time.
pub const FLOW_PAGE_LEN: usize = 256;

/// Applies a flow's events until `limit` applications (`None`: no limit), a
/// gap, a blocked event, or nothing more, at most `batch_len_max` events per
/// transaction. Only [`DrainStop::Idle`] means the flow is caught up.
pub fn drain<C, H>(
    consumer: &mut C,
    flow: &InboxFlow,
    limit: Option<u64>,
    handler: &mut H,
    batch_len_max: u64,
) -> Result<Drain, StoreError>
where
    C: ConsumerStore + ?Sized,
    H: ApplyHandler<C::Tx> + ?Sized,
{
    let mut drains = drain_flows(
        consumer,
        vec![(flow.clone(), limit)],
        handler,
        batch_len_max,
    )?;
    assert_eq!(drains.len(), 1, "one drain per flow");
    Ok(drains.remove(0))
}

/// Drains every flow that has work, each with its own `limit`, at most
/// `batch_len_max` events per transaction across flows; a blocked or gapped
/// flow never stops the others.
pub fn process_all<C, H>(
    consumer: &mut C,
    limit: Option<u64>,
    handler: &mut H,
    batch_len_max: u64,
) -> Result<Vec<Drain>, StoreError>
where
    C: ConsumerStore + ?Sized,
    H: ApplyHandler<C::Tx> + ?Sized,
{
    let mut all = Vec::new();
    process_all_each(consumer, limit, handler, batch_len_max, |drain| {
        all.push(drain)
    })?;
    Ok(all)
}

/// [`process_all`] handing each flow's drain to `each` instead of collecting
/// them: memory stays bounded by one page of flows, however many have work.
pub fn process_all_each<C, H>(
    consumer: &mut C,
    limit: Option<u64>,
    handler: &mut H,
    batch_len_max: u64,
    mut each: impl FnMut(Drain),
) -> Result<(), StoreError>
where
    C: ConsumerStore + ?Sized,
    H: ApplyHandler<C::Tx> + ?Sized,
{
    let mut after: Option<InboxFlow> = None;
    loop {
        after = process_page(
            consumer,
            after.as_ref(),
            limit,
            handler,
            batch_len_max,
            &mut each,
        )?;
        if after.is_none() {
            return Ok(());
        }
    }
}

/// One page of [`process_all_each`]: drains up to [`FLOW_PAGE_LEN`] flows
/// with work after `after`, and returns the last flow of the page, from
/// which the next page starts (`None`: no flow with work was left). Lets a
/// long-running loop stop between pages.
pub fn process_page<C, H>(
    consumer: &mut C,
    after: Option<&InboxFlow>,
    limit: Option<u64>,
    handler: &mut H,
    batch_len_max: u64,
    mut each: impl FnMut(Drain),
) -> Result<Option<InboxFlow>, StoreError>
where
    C: ConsumerStore + ?Sized,
    H: ApplyHandler<C::Tx> + ?Sized,
{
    let reevaluate = handler.reevaluate().to_vec();
    let page = consumer.flows_with_work_page(after, FLOW_PAGE_LEN, &reevaluate)?;
    let Some(last) = page.last().cloned() else {
        return Ok(None);
    };
    let work = page.into_iter().map(|flow| (flow, limit)).collect();
    drain_flows(consumer, work, handler, batch_len_max)?
        .into_iter()
        .for_each(&mut each);
    Ok(Some(last))
}

/// Drains `work` in batches, resuming a flow cut short by a batch's end with
/// what is left of its own limit.
fn drain_flows<C, H>(
    consumer: &mut C,
    mut work: Vec<(InboxFlow, Option<u64>)>,
    handler: &mut H,
    batch_len_max: u64,
) -> Result<Vec<Drain>, StoreError>
where
    C: ConsumerStore + ?Sized,
    H: ApplyHandler<C::Tx> + ?Sized,
{
    let batch_len_max = batch_len_max.max(1);
    let mut done: Vec<Drain> = Vec::with_capacity(work.len());
    while !work.is_empty() {
        let drains = consumer.apply_batch_with(&work, batch_len_max, handler)?;
        assert!(
            !drains.is_empty() && drains.len() <= work.len(),
            "a batch visits its first flow"
        );
        let visited = drains.len();
        let mut resume = None;
        for (drain, (_, limit)) in drains.into_iter().zip(&work) {
            debug_assert!(limit.is_none_or(|limit| drain.applied <= limit));
            let own_limit_reached = limit.is_some_and(|limit| drain.applied >= limit);
            let merged = match done.last_mut() {
                Some(previous) if previous.flow == drain.flow => {
                    previous.applied += drain.applied;
                    previous.stop = drain.stop.clone();
                    previous.clone()
                }
                _ => {
                    done.push(drain.clone());
                    drain.clone()
                }
            };
            if drain.stop == DrainStop::Limit && !own_limit_reached {
                resume = Some((merged.flow, limit.map(|limit| limit - drain.applied)));
            }
        }
        work.drain(..visited);
        if let Some(resume) = resume {
            work.insert(0, resume);
        }
    }
    Ok(done)
}

/// What is stored at a flow's next seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextRow {
    /// Nothing at the next seq.
    Missing {
        /// Whether a later seq of the flow is stored.
        later_stored: bool,
    },
    /// A row with this status.
    Stored(InboxStatus),
}

/// What apply must do about a flow's next seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyPlan {
    /// Report this step; write nothing.
    Report(StepKind),
    /// Decode and validate the stored event, then apply or block it.
    Evaluate,
}

/// A step that needs no write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    /// The next seq is missing, a later one is stored.
    Gap,
    /// Nothing after the applied seq.
    Idle,
    /// Blocked earlier with this reason, and still blocked.
    Blocked(BlockReason),
}

/// Plans apply at a flow's next seq. A row blocked with one of the
/// `reevaluate` codes is evaluated again; other blocks hold.
pub fn plan_apply(next: NextRow, reevaluate: &[BlockCode]) -> ApplyPlan {
    match next {
        NextRow::Missing { later_stored: true } => ApplyPlan::Report(StepKind::Gap),
        NextRow::Missing {
            later_stored: false,
        } => ApplyPlan::Report(StepKind::Idle),
        NextRow::Stored(InboxStatus::Pending) => ApplyPlan::Evaluate,
        NextRow::Stored(InboxStatus::Blocked(reason)) if reevaluate.contains(&reason.code) => {
            ApplyPlan::Evaluate
        }
        NextRow::Stored(InboxStatus::Blocked(reason)) => {
            ApplyPlan::Report(StepKind::Blocked(reason))
        }
        NextRow::Stored(InboxStatus::Applied | InboxStatus::Skipped) => {
            unreachable!("the row after the applied seq is never applied or skipped")
        }
    }
}

impl StepKind {
    /// The step reported for `next` (the flow's next seq).
    pub fn into_step(self, next: Seq) -> Step {
        match self {
            StepKind::Gap => Step::Gap { missing: next },
            StepKind::Idle => Step::Idle,
            StepKind::Blocked(reason) => Step::Blocked { seq: next, reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flows_page_starts_at_the_later_bound_and_ends_past_its_prefix() {
        let after = FlowId::new("o-2").unwrap();
        let page = |prefix, after| FlowsPage {
            prefix,
            after,
            after_producer: "",
            limit: 3,
        };
        assert_eq!(page("o-", None).bounds(), ("o-", "", 3));
        assert_eq!(page("o-", Some(&after)).bounds(), ("o-2", "o-2", 3));
        assert_eq!(page("o-3", Some(&after)).bounds(), ("o-3", "o-2", 3));
        let rows = vec![("o-3".into(), 1), ("o-4".into(), 2), ("p-1".into(), 5)];
        let flows = page("o-", Some(&after)).producer_flows(rows).unwrap();
        let ids: Vec<&str> = flows.iter().map(|f| f.flow_id.as_str()).collect();
        assert_eq!(ids, ["o-3", "o-4"]);
        let bad = page("", None).consumer_flows(vec![("".into(), "default".into(), 1)]);
        assert_eq!(bad.unwrap_err().kind(), ErrorKind::Corrupt);
        let zero_seq = page("", None).producer_flows(vec![("o-1".into(), 0)]);
        assert_eq!(zero_seq.unwrap_err().kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn apply_plans() {
        let schema = BlockCode::from_static("unsupported_schema");
        let payload = BlockCode::from_static("invalid_payload");
        let blocked = |code| NextRow::Stored(InboxStatus::Blocked(BlockReason::code(code)));
        let reported = |code| ApplyPlan::Report(StepKind::Blocked(BlockReason::code(code)));
        let none: &[BlockCode] = &[];
        let cases = [
            (
                NextRow::Missing { later_stored: true },
                none,
                ApplyPlan::Report(StepKind::Gap),
            ),
            (
                NextRow::Missing {
                    later_stored: false,
                },
                none,
                ApplyPlan::Report(StepKind::Idle),
            ),
            (
                NextRow::Stored(InboxStatus::Pending),
                none,
                ApplyPlan::Evaluate,
            ),
            (blocked(schema), none, reported(schema)),
            (blocked(schema), &[schema][..], ApplyPlan::Evaluate),
            (blocked(payload), &[schema][..], reported(payload)),
            (
                blocked(payload),
                &[schema, payload][..],
                ApplyPlan::Evaluate,
            ),
        ];
        for (next, reevaluate, expected) in cases {
            assert_eq!(
                plan_apply(next.clone(), reevaluate),
                expected,
                "{next:?} {reevaluate:?}"
            );
        }
    }
}
