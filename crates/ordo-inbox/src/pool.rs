//! Store handles for an inbox: opened on demand through the caller's
//! opener, kept for reuse between deliveries. Every call blocks: an async
//! transport runs it on a blocking thread of its own runtime.
//!
//! Invariant: the inbox knows no backend. It sees a store only through
//! [`InboxStore`] (receive a batch in one transaction, read the status), so
//! any [`ConsumerStore`] can stand behind it; how a handle is opened (file,
//! clock, busy timeout) is the opener's.

use std::sync::{Arc, Mutex};

use ordo_core::ops::ConsumerStatus;
use ordo_core::{ConsumerStore, Envelope, ErrorKind, Receipt, StoreError};

/// What the server asks of a consumer store.
pub trait InboxStore: Send {
    /// Stores `envelopes` in one transaction, durable before it returns;
    /// one receipt per envelope, in order.
    fn receive_batch(&mut self, envelopes: &[Envelope]) -> Result<Vec<Receipt>, StoreError>;
    /// The inbox's counts (pending, blocked, gaps).
    fn consumer_status(&mut self) -> Result<ConsumerStatus, StoreError>;
}

impl<S: ConsumerStore + Send> InboxStore for S {
    fn receive_batch(&mut self, envelopes: &[Envelope]) -> Result<Vec<Receipt>, StoreError> {
        ConsumerStore::receive_batch(self, envelopes)
    }

    fn consumer_status(&mut self) -> Result<ConsumerStatus, StoreError> {
        ConsumerStore::consumer_status(self)
    }
}

/// Opens one more handle on the consumer store.
pub type Opener = Arc<dyn Fn() -> Result<Box<dyn InboxStore>, StoreError> + Send + Sync>;

/// Handles kept between deliveries; at most `idle_max` wait idle, more are
/// opened when deliveries overlap (their number is bounded by the
/// transport's limits on deliveries in flight).
pub struct Pool {
    open: Opener,
    idle: Mutex<Vec<Box<dyn InboxStore>>>,
    idle_max: usize,
}

impl Pool {
    /// A pool that opens handles with `open` and keeps up to `idle_max`.
    pub fn new(open: Opener, idle_max: usize) -> Pool {
        Pool {
            open,
            idle: Mutex::new(Vec::new()),
            idle_max,
        }
    }

    /// Runs `f` on a handle, blocking. A handle that failed other than
    /// `Busy` is dropped, so that the next delivery opens a fresh one.
    pub fn with_store<T>(
        &self,
        f: impl FnOnce(&mut dyn InboxStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut store = self.take()?;
        let outcome = f(store.as_mut());
        if outcome
            .as_ref()
            .err()
            .is_none_or(|e| e.kind() == ErrorKind::Busy)
        {
            self.put(store);
        }
        outcome
    }

    fn take(&self) -> Result<Box<dyn InboxStore>, StoreError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(store) => Ok(store),
            None => (self.open)(),
        }
    }

    fn put(&self, store: Box<dyn InboxStore>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.idle_max {
            idle.push(store);
        }
    }
}
