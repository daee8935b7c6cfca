//! In-process wake-ups: a commit that gives a loop work (an append to an
//! outbox, a receive into an inbox) raises the signal of its file, and a
//! loop of the same process waiting on that file wakes at once instead of
//! at its next poll. Other processes' commits are found by polling.
//!
//! Invariant: a signal is only a hint to look; the loops always read the
//! store to learn what there is to do, so a lost or spurious wake-up costs
//! at most one poll interval or one empty look.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// The wake-up signal of one database file in this process.
#[derive(Debug, Clone)]
pub struct Signal {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    raised: Mutex<u64>,
    changed: Condvar,
}

/// Every file's signal, by canonical path: two handles on one file share one.
fn registry() -> &'static Mutex<HashMap<PathBuf, Signal>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PathBuf, Signal>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Signal {
    /// The signal of the file at `path` (by its canonical path when it
    /// exists).
    pub fn for_path(path: &Path) -> Signal {
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
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
    fn a_raise_wakes_a_waiter_at_once_and_handles_share_a_file_signal() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.db");
        std::fs::write(&file, b"").unwrap();
        let a = Signal::for_path(&file);
        let b = Signal::for_path(&dir.path().join(".").join("p.db"));
        let seen = a.generation();
        let waiter = std::thread::spawn(move || (b.wait(seen, Duration::from_secs(30)), ()));
        std::thread::sleep(Duration::from_millis(50));
        a.raise();
        let (generation, ()) = waiter.join().unwrap();
        assert_eq!(generation, seen + 1, "woken by the raise, not the timeout");
    }

    #[test]
    fn a_wait_without_raise_returns_after_its_timeout_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let signal = Signal::for_path(&dir.path().join("c.db"));
        let seen = signal.generation();
        assert_eq!(signal.wait(seen, Duration::from_millis(10)), seen);
    }
}
