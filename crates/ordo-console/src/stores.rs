//! How the console holds its stores: through the object-safe operator
//! views of `ordo-core` ([`ProducerOps`], [`ConsumerHandle`]), so that it
//! knows no backend and writes no SQL; how a handle is opened (file or
//! URL, clock, never creating a store) is the caller's. [`keep_idle`]
//! keeps a few handles open between requests, so that a page does not pay
//! for opening a store (for PostgreSQL, a connection) each time.

use std::sync::Arc;

use ordo_core::{ConsumerHandle, ProducerOps, StoreError};
pub use ordo_inbox::IdlePool;

/// Opens one more handle on a store.
pub type Opener<V> = Arc<dyn Fn() -> Result<Box<V>, StoreError> + Send + Sync>;
/// Opens one more handle on the producer store.
pub type ProducerOpener = Opener<dyn ProducerOps + Send>;
/// Opens one more handle on the consumer store.
pub type ConsumerOpener = Opener<dyn ConsumerHandle>;
/// Lends a handle: an idle one, or one opened now (see [`keep_idle`]).
pub type Lender<V> = Arc<dyn Fn() -> Result<Kept<V>, StoreError> + Send + Sync>;

/// Handles opened earlier and idle now, shared by one opener's handles.
type Idle<V> = Arc<IdlePool<Box<V>>>;

/// A handle lent out by a keeping opener: back among the idle ones when
/// dropped, unless one of its calls failed (then it is closed, and the
/// next request opens a new one) or enough are idle already.
pub struct Kept<V: ?Sized + Send + 'static> {
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
    pub fn call<T>(
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

/// `open`, keeping up to `idle_max` of its handles open between requests:
/// a request takes an idle handle if there is one, and gives it back when
/// done, unless one of its reads or writes failed.
pub fn keep_idle<V: ?Sized + Send + 'static>(open: Opener<V>, idle_max: usize) -> Lender<V> {
    let idle: Idle<V> = Arc::default();
    Arc::new(move || Kept::lend(&idle, idle_max, || open()))
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
                Ok(Box::new(store) as Box<dyn ProducerOps + Send>)
            })
        };
        let open = keep_idle(open, 2);
        let opened = || opened.load(Ordering::SeqCst);
        for _ in 0..3 {
            open().unwrap().call(|s| s.producer_status(0)).unwrap();
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
        assert!(broken
            .call(|s| s.producer_flows_page("", None, 10))
            .is_err());
        drop(broken);
        let _one_idle_then_a_new_one = (open().unwrap(), open());
        assert_eq!(opened(), 4, "the failed handle was not kept");
    }
}
