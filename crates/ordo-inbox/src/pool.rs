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
    idle: Mutex<Vec<Box<dyn ConsumerHandle>>>,
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
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(store) => Ok(store),
            None => (self.open)(),
        }
    }

    fn put(&self, store: Box<dyn ConsumerHandle>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.idle_max {
            idle.push(store);
        }
    }
}

/// The idle handles are closed on a thread of their own: not on an async
/// runtime's thread (where a server drops its pool), on which PostgreSQL's
/// blocking client, which runs a runtime of its own, cannot close.
impl Drop for Pool {
    fn drop(&mut self) {
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !idle.is_empty() {
            let _ = std::thread::spawn(move || drop(idle)).join();
        }
    }
}
