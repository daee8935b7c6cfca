//! In-process wake-ups: a commit that gives a loop work (an append to an
//! outbox, a receive into an inbox) raises the signal of its store, and a
//! loop of the same process waiting on that store wakes at once instead of
//! at its next poll. Other processes' commits are found by the store's own
//! watch ([`RunStore::changed_elsewhere`](crate::run::RunStore::changed_elsewhere))
//! or by polling.
//!
//! Invariant: a signal is only a hint to look; the loops always read the
//! store to learn what there is to do, so a lost or spurious wake-up costs
//! at most one poll interval or one empty look. A signal performs no I/O:
//! a backend names its store by a key of its own (a canonical path, a URL
//! and schema).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// The wake-up signal of one store in this process.
#[derive(Debug, Clone)]
pub struct Signal {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    raised: Mutex<u64>,
    changed: Condvar,
}

/// Every store's signal, by its key: two handles on one store share one.
fn registry() -> &'static Mutex<HashMap<String, Signal>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Signal>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Signal {
    /// The signal of the store named `key` in this process (the same key,
    /// the same signal).
    pub fn for_key(key: impl Into<String>) -> Signal {
        let key = key.into();
        let mut map = registry().lock().unwrap_or_else(|e| e.into_inner());
        map.entry(key)
            .or_insert_with(|| Signal {
                inner: Arc::new(Inner::default()),
            })
            .clone()
    }

    /// How many times the signal has been raised so far: pass it to
    /// [`Signal::wait`] to wait for the next raise.
    pub fn generation(&self) -> u64 {
        *self.inner.raised.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raises the signal, waking every waiter.
    pub fn raise(&self) {
        let mut raised = self.inner.raised.lock().unwrap_or_else(|e| e.into_inner());
        *raised = raised.wrapping_add(1);
        self.inner.changed.notify_all();
    }

    /// Waits until the signal is raised past `seen` (a [`Signal::generation`])
    /// or `timeout` passes; returns the generation then.
    pub fn wait(&self, seen: u64, timeout: Duration) -> u64 {
        let raised = self.inner.raised.lock().unwrap_or_else(|e| e.into_inner());
        let (raised, _) = self
            .inner
            .changed
            .wait_timeout_while(raised, timeout, |raised| *raised == seen)
            .unwrap_or_else(|e| e.into_inner());
        *raised
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raise_wakes_a_waiter_at_once_and_handles_share_a_store_signal() {
        let a = Signal::for_key("wake-test-shared");
        let b = Signal::for_key(String::from("wake-test-shared"));
        let seen = a.generation();
        let waiter = std::thread::spawn(move || (b.wait(seen, Duration::from_secs(30)), ()));
        std::thread::sleep(Duration::from_millis(50));
        a.raise();
        let (generation, ()) = waiter.join().unwrap();
        assert_eq!(generation, seen + 1, "woken by the raise, not the timeout");
    }

    #[test]
    fn a_wait_without_raise_returns_after_its_timeout_unchanged() {
        let signal = Signal::for_key("wake-test-alone");
        let seen = signal.generation();
        assert_eq!(signal.wait(seen, Duration::from_millis(10)), seen);
    }
}
