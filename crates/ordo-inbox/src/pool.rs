//! Store handles for an inbox: opened on demand through the caller's
//! opener, kept for reuse between deliveries. Every call blocks: an async
//! transport runs it on a blocking thread of its own runtime.
//!
//! Invariant: the inbox knows no backend. It sees a store only through
//! `ordo-core`'s object-safe [`ConsumerHandle`] (receive a batch in one
//! transaction, read the status), so any consumer store can stand behind
//! it; how a handle is opened (file, clock, busy timeout) is the opener's.

use std::sync::{Arc, Mutex};

use ordo_core::{ConsumerHandle, ErrorKind, StoreError};

/// Opens one more handle on the consumer store.
pub type Opener = Arc<dyn Fn() -> Result<Box<dyn ConsumerHandle>, StoreError> + Send + Sync>;

/// Handles kept between deliveries; at most `idle_max` wait idle, more are
/// opened when deliveries overlap (their number is bounded by the
/// transport's limits on deliveries in flight).
pub struct Pool {
    open: Opener,
    idle: IdlePool<Box<dyn ConsumerHandle>>,
    idle_max: usize,
}

impl Pool {
    /// A pool that opens handles with `open` and keeps up to `idle_max`.
    pub fn new(open: Opener, idle_max: usize) -> Pool {
        Pool {
            open,
            idle: IdlePool::default(),
            idle_max,
        }
    }

    /// Runs `f` on a handle, blocking. A handle that failed other than
    /// `Busy` is dropped, so that the next delivery opens a fresh one.
    pub fn with_store<T>(
        &self,
        f: impl FnOnce(&mut dyn ConsumerHandle) -> Result<T, StoreError>,
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

    fn take(&self) -> Result<Box<dyn ConsumerHandle>, StoreError> {
        match self.idle.take() {
            Some(store) => Ok(store),
            None => (self.open)(),
        }
    }

    fn put(&self, store: Box<dyn ConsumerHandle>) {
        self.idle.put(store, self.idle_max);
    }
}

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
