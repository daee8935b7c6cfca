//! What the console asks of the stores, as object-safe traits with a
//! blanket implementation over every [`ProducerStore`] and
//! [`ConsumerStore`]: the console knows no backend and writes no SQL; how
//! a handle is opened (file or URL, clock, never creating a store) is the
//! caller's.

use std::sync::Arc;

use ordo_core::ops::{
    ConsumerFlow, ConsumerStatus, InboxEntry, OutboxEntry, ProducerFlow, ProducerStatus,
    RepairRecord, RetryRefused, SkipRefused, SkipRequest,
};
use ordo_core::{ConsumerStore, EventId, FlowId, ProducerStore, Seq, StoreError};

/// The producer reads of the console.
pub trait ProducerView: Send {
    /// [`ProducerStore::producer_status`].
    fn status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError>;
    /// [`ProducerStore::producer_flows_page`].
    fn flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ProducerFlow>, StoreError>;
    /// [`ProducerStore::flow_outbox_entries`].
    fn flow_entries(
        &mut self,
        flow_id: &FlowId,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError>;
    /// [`ProducerStore::outbox_entries`] of the quarantined rows.
    fn quarantined(&mut self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError>;
    /// [`ProducerStore::retry_quarantined`], as `ordo outbox retry`.
    fn retry(&mut self, event_id: &EventId) -> Result<Result<(), RetryRefused>, StoreError>;
}

impl<S: ProducerStore + Send> ProducerView for S {
    fn status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError> {
        self.producer_status(now_ms)
    }

    fn flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ProducerFlow>, StoreError> {
        self.producer_flows_page(prefix, after, limit)
    }

    fn flow_entries(
        &mut self,
        flow_id: &FlowId,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        self.flow_outbox_entries(flow_id, limit)
    }

    fn quarantined(&mut self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        self.outbox_entries(true, limit)
    }

    fn retry(&mut self, event_id: &EventId) -> Result<Result<(), RetryRefused>, StoreError> {
        self.retry_quarantined(event_id)
    }
}

/// The consumer reads of the console.
pub trait ConsumerView: Send {
    /// [`ConsumerStore::consumer_status`].
    fn status(&mut self) -> Result<ConsumerStatus, StoreError>;
    /// [`ConsumerStore::consumer_flows_page`].
    fn flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ConsumerFlow>, StoreError>;
    /// [`ConsumerStore::inbox_entries`].
    fn entries(
        &mut self,
        blocked_only: bool,
        flow_id: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<InboxEntry>, StoreError>;
    /// [`ConsumerStore::inbox_entry_at`].
    fn entry_at(&mut self, flow_id: &FlowId, seq: Seq) -> Result<Option<InboxEntry>, StoreError>;
    /// [`ConsumerStore::repairs`].
    fn repair_log(&mut self) -> Result<Vec<RepairRecord>, StoreError>;
    /// [`ConsumerStore::skip`], as `ordo inbox skip`.
    fn skip_next(
        &mut self,
        request: &SkipRequest,
    ) -> Result<Result<RepairRecord, SkipRefused>, StoreError>;
}

impl<S: ConsumerStore + Send> ConsumerView for S {
    fn status(&mut self) -> Result<ConsumerStatus, StoreError> {
        self.consumer_status()
    }

    fn flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ConsumerFlow>, StoreError> {
        self.consumer_flows_page(prefix, after, limit)
    }

    fn entries(
        &mut self,
        blocked_only: bool,
        flow_id: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<InboxEntry>, StoreError> {
        self.inbox_entries(blocked_only, flow_id, limit)
    }

    fn entry_at(&mut self, flow_id: &FlowId, seq: Seq) -> Result<Option<InboxEntry>, StoreError> {
        self.inbox_entry_at(flow_id, seq)
    }

    fn repair_log(&mut self) -> Result<Vec<RepairRecord>, StoreError> {
        self.repairs()
    }

    fn skip_next(
        &mut self,
        request: &SkipRequest,
    ) -> Result<Result<RepairRecord, SkipRefused>, StoreError> {
        self.skip(request)
    }
}

/// Opens one more handle on the producer store.
pub type ProducerOpener = Arc<dyn Fn() -> Result<Box<dyn ProducerView>, StoreError> + Send + Sync>;
/// Opens one more handle on the consumer store.
pub type ConsumerOpener = Arc<dyn Fn() -> Result<Box<dyn ConsumerView>, StoreError> + Send + Sync>;
