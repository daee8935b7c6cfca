//! What the console asks of the stores, as object-safe traits with a
//! blanket implementation over every [`ProducerStore`] and
//! [`ConsumerStore`]: the console knows no backend and writes no SQL; how
//! a handle is opened (file or URL, clock, never creating a store) is the
//! caller's. [`keep_idle_producers`] and [`keep_idle_consumers`] keep a
//! few handles open between requests, so that a page does not pay for
//! opening a store (for PostgreSQL, a connection) each time.

use std::sync::{Arc, Mutex};

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
    /// [`ConsumerStore::inbox_entry_of_event`].
    fn entry_of_event(&mut self, event_id: &EventId) -> Result<Option<InboxEntry>, StoreError>;
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

    fn entry_of_event(&mut self, event_id: &EventId) -> Result<Option<InboxEntry>, StoreError> {
        self.inbox_entry_of_event(event_id)
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

/// Handles opened earlier and idle now, shared by one opener's handles.
type Idle<V> = Arc<IdlePool<Box<V>>>;

/// Store handles kept open between requests. Those still idle when the
/// pool goes are closed on a thread of their own: not on an async
/// runtime's thread, where PostgreSQL's blocking client (which runs a
/// runtime of its own) cannot close.
pub struct IdlePool<T: Send + 'static>(Mutex<Vec<T>>);

impl<T: Send + 'static> Default for IdlePool<T> {
    fn default() -> Self {
        IdlePool(Mutex::new(Vec::new()))
    }
}

impl<T: Send + 'static> IdlePool<T> {
    /// An idle handle, if there is one.
    pub fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Keeps `handle` for a later request, unless `max` are idle already
    /// (then it is closed).
    pub fn put(&self, handle: T, max: usize) {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < max {
            idle.push(handle);
        }
    }
}

impl<T: Send + 'static> Drop for IdlePool<T> {
    fn drop(&mut self) {
        let handles = std::mem::take(self.0.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !handles.is_empty() {
            let _ = std::thread::spawn(move || drop(handles)).join();
        }
    }
}

/// A handle lent out by a keeping opener: back among the idle ones when
/// dropped, unless one of its calls failed (then it is closed, and the
/// next request opens a new one) or enough are idle already.
struct Kept<V: ?Sized + Send + 'static> {
    handle: Option<Box<V>>,
    idle: Idle<V>,
    idle_max: usize,
    failed: bool,
}

impl<V: ?Sized + Send + 'static> Kept<V> {
    /// Lends an idle handle, or one `open` opens.
    fn lend(
        idle: &Idle<V>,
        idle_max: usize,
        open: impl FnOnce() -> Result<Box<V>, StoreError>,
    ) -> Result<Kept<V>, StoreError> {
        let handle = idle.take();
        Ok(Kept {
            handle: Some(match handle {
                Some(handle) => handle,
                None => open()?,
            }),
            idle: Arc::clone(idle),
            idle_max,
            failed: false,
        })
    }

    /// Runs `call` on the handle, remembering a failure.
    fn call<T>(
        &mut self,
        call: impl FnOnce(&mut V) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let handle = self
            .handle
            .as_mut()
            .expect("a lent handle is held until dropped");
        let result = call(handle);
        self.failed |= result.is_err();
        result
    }
}

impl<V: ?Sized + Send + 'static> Drop for Kept<V> {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        if self.failed {
            return;
        }
        self.idle.put(handle, self.idle_max);
    }
}

impl ProducerView for Kept<dyn ProducerView> {
    fn status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError> {
        self.call(|h| h.status(now_ms))
    }

    fn flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ProducerFlow>, StoreError> {
        self.call(|h| h.flows_page(prefix, after, limit))
    }

    fn flow_entries(
        &mut self,
        flow_id: &FlowId,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        self.call(|h| h.flow_entries(flow_id, limit))
    }

    fn quarantined(&mut self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        self.call(|h| h.quarantined(limit))
    }

    fn retry(&mut self, event_id: &EventId) -> Result<Result<(), RetryRefused>, StoreError> {
        self.call(|h| h.retry(event_id))
    }
}

impl ConsumerView for Kept<dyn ConsumerView> {
    fn status(&mut self) -> Result<ConsumerStatus, StoreError> {
        self.call(|h| h.status())
    }

    fn flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ConsumerFlow>, StoreError> {
        self.call(|h| h.flows_page(prefix, after, limit))
    }

    fn entries(
        &mut self,
        blocked_only: bool,
        flow_id: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<InboxEntry>, StoreError> {
        self.call(|h| h.entries(blocked_only, flow_id, limit))
    }

    fn entry_at(&mut self, flow_id: &FlowId, seq: Seq) -> Result<Option<InboxEntry>, StoreError> {
        self.call(|h| h.entry_at(flow_id, seq))
    }

    fn entry_of_event(&mut self, event_id: &EventId) -> Result<Option<InboxEntry>, StoreError> {
        self.call(|h| h.entry_of_event(event_id))
    }

    fn repair_log(&mut self) -> Result<Vec<RepairRecord>, StoreError> {
        self.call(|h| h.repair_log())
    }

    fn skip_next(
        &mut self,
        request: &SkipRequest,
    ) -> Result<Result<RepairRecord, SkipRefused>, StoreError> {
        self.call(|h| h.skip_next(request))
    }
}

/// `open`, keeping up to `idle_max` of its handles open between requests:
/// a request takes an idle handle if there is one, and gives it back when
/// done, unless one of its reads or writes failed.
pub fn keep_idle_producers(open: ProducerOpener, idle_max: usize) -> ProducerOpener {
    let idle: Idle<dyn ProducerView> = Arc::default();
    Arc::new(move || {
        let kept = Kept::lend(&idle, idle_max, || open())?;
        Ok(Box::new(kept) as Box<dyn ProducerView>)
    })
}

/// [`keep_idle_producers`] for the consumer.
pub fn keep_idle_consumers(open: ConsumerOpener, idle_max: usize) -> ConsumerOpener {
    let idle: Idle<dyn ConsumerView> = Arc::default();
    Arc::new(move || {
        let kept = Kept::lend(&idle, idle_max, || open())?;
        Ok(Box::new(kept) as Box<dyn ConsumerView>)
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use ordo_core::SystemClock;
    use ordo_sqlite::{OpenOptions, ProducerDb, Schema};

    use super::*;

    /// Idle handles are lent again instead of opening new ones, at most
    /// `idle_max` are kept, and a handle whose read failed is closed.
    #[test]
    fn idle_handles_are_lent_again_and_a_failed_one_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        let options = OpenOptions::default();
        let schema = Schema::new("kept").unwrap();
        drop(ProducerDb::open_or_create(&path, &schema, Arc::new(SystemClock), &options).unwrap());
        let opened = Arc::new(AtomicUsize::new(0));
        let open: ProducerOpener = {
            let (path, opened) = (path.clone(), Arc::clone(&opened));
            Arc::new(move || {
                opened.fetch_add(1, Ordering::SeqCst);
                let store = ProducerDb::open_existing(&path, Arc::new(SystemClock), &options)?;
                Ok(Box::new(store) as Box<dyn ProducerView>)
            })
        };
        let open = keep_idle_producers(open, 2);
        let opened = || opened.load(Ordering::SeqCst);
        for _ in 0..3 {
            open().unwrap().status(0).unwrap();
        }
        assert_eq!(opened(), 1, "one handle, lent three times");
        let three: Vec<_> = (0..3).map(|_| open().unwrap()).collect();
        assert_eq!(opened(), 3, "the idle one and two new ones");
        drop(three);
        let two = (open().unwrap(), open().unwrap());
        assert_eq!(opened(), 3, "two were kept");
        drop(two);
        ordo_sqlite::rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE outbox_head")
            .unwrap();
        let mut broken = open().unwrap();
        assert!(broken.flows_page("", None, 10).is_err());
        drop(broken);
        let _one_idle_then_a_new_one = (open().unwrap(), open());
        assert_eq!(opened(), 4, "the failed handle was not kept");
    }
}
