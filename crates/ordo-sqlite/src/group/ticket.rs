//! One submitted unit's place in the queue and its result: the caller
//! waits on its ticket; the writer takes it out of the queue, runs it, and
//! fills it after the transaction that holds it has ended.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use ordo_core::StoreError;

use crate::producer::ProducerTx;

/// Where a unit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// In the queue: the writer has not taken it, so it can still be
    /// withdrawn and will then never run.
    Queued,
    /// Taken by the writer: it runs in the next transaction, whose outcome
    /// the caller will be told, however long that takes.
    Taken,
    /// Its result is in the ticket (or was handed out).
    Done,
    /// Withdrawn from the queue before the writer took it: never run.
    Withdrawn,
}

/// A ticket's state, under its own lock.
pub(crate) struct Slot<R> {
    pub phase: Phase,
    pub result: Option<R>,
    pub waker: Option<Waker>,
    /// The caller waits on [`Ticket::ready`]: only then does filling the
    /// ticket notify it (a caller that ran its own unit never waits).
    pub waiting: bool,
}

/// A unit's ticket, shared by its caller and the writer.
pub(crate) struct Ticket<R> {
    pub id: u64,
    pub slot: Mutex<Slot<R>>,
    pub ready: Condvar,
}

/// Locks, ignoring poisoning: every critical section here leaves its data
/// consistent, and a unit's panic is caught before it could poison anything.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `condvar` for at most `wait`, through a poisoned lock as
/// [`lock`] does; the caller checks again what it waits for.
pub(crate) fn wait_at_most<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    wait: Duration,
) -> MutexGuard<'a, T> {
    condvar
        .wait_timeout(guard, wait)
        .unwrap_or_else(|e| e.into_inner())
        .0
}

impl<R> Ticket<R> {
    pub fn new(id: u64) -> Arc<Ticket<R>> {
        Arc::new(Ticket {
            id,
            slot: Mutex::new(Slot {
                phase: Phase::Queued,
                result: None,
                waker: None,
                waiting: false,
            }),
            ready: Condvar::new(),
        })
    }

    /// Fills the ticket, once, and wakes its caller.
    pub fn fill(&self, result: R) {
        let mut slot = lock(&self.slot);
        if slot.phase == Phase::Done || slot.phase == Phase::Withdrawn {
            return;
        }
        slot.phase = Phase::Done;
        slot.result = Some(result);
        if let Some(waker) = slot.waker.take() {
            waker.wake();
        }
        if slot.waiting {
            self.ready.notify_all();
        }
    }
}

/// What happened to a unit that the writer ran.
pub(crate) enum Ran {
    /// Its writes stay in the transaction.
    Kept,
    /// Its writes were rolled back to its savepoint; the others go on.
    Undone,
    /// It ran without a savepoint (alone in its transaction) and failed:
    /// the transaction must be rolled back.
    Failed,
}

/// A queued unit, whatever its result type.
pub(crate) trait Job: Send {
    /// The ticket's id, to withdraw it from the queue.
    fn id(&self) -> u64;
    /// Marks the ticket taken (called with the queue locked).
    fn mark_taken(&self);
    /// Runs the unit, under its own savepoint with `savepoint`, else as
    /// the transaction's first and only unit so far. An error means the
    /// transaction itself can no longer go on.
    fn run(&mut self, ptx: &mut ProducerTx<'_>, savepoint: bool) -> Result<Ran, StoreError>;
    /// Tells the caller, once the transaction ended: committed (`Ok`), or
    /// not (`Err`, the transaction's error).
    fn settle(self: Box<Self>, ended: Result<(), &StoreError>);
}

/// The queue of units in arrival order, bounded.
pub(crate) struct Queue {
    pub jobs: VecDeque<Box<dyn Job>>,
    /// No more units are accepted; the writer runs those queued and stops.
    pub closed: bool,
    /// The next ticket id.
    pub next_id: u64,
    /// The writer thread waits for work. Set and cleared under the lock,
    /// after it found the queue empty: while it is false, the writer will
    /// look at the queue again before it waits, so a caller queueing a unit
    /// need not wake it.
    pub writer_waiting: bool,
    /// Submitters waiting for room in a full queue: taking or withdrawing a
    /// unit notifies them only when there are any.
    pub room_waiters: usize,
}

impl Queue {
    /// Removes the unit `id` if it is still queued; returns whether it was.
    pub fn withdraw(&mut self, id: u64) -> bool {
        match self.jobs.iter().position(|job| job.id() == id) {
            Some(at) => {
                // Dropping a job that never ran fills nothing: its caller
                // is the one withdrawing it.
                drop(self.jobs.remove(at));
                true
            }
            None => false,
        }
    }
}

/// The time left until `deadline`, `None` once it passed.
pub(crate) fn left(deadline: Instant) -> Option<std::time::Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}
