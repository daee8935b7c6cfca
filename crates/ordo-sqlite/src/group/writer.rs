//! Running batches: take units in arrival order, run a batch of them in
//! one transaction, commit, then settle each. Whoever holds the store runs
//! them: the writer thread, or a blocking caller that found the store idle
//! (see [`lead`]).
//!
//! Invariant: units are taken from the queue only by the holder of the
//! store's lock, so batches never overlap and arrival order is commit
//! order.

use std::sync::MutexGuard;
use std::time::Instant;

use ordo_core::{crash, StoreError};

use super::ticket::{lock, Job, Phase, Ran, Ticket};
use super::unit::{run_caught, settled, still_open, Outcome};
use super::Shared;
use crate::producer::{ProducerDb, ProducerTx};

/// The writer thread: runs batches until the queue is closed and empty.
pub(crate) fn run(shared: &Shared) {
    // A writer that unwinds (never by a unit's panic, which is caught)
    // still tells every queued caller that its unit was not run.
    let _guard = CloseOnDrop(shared);
    while wait_for_work(shared) {
        let mut db = lock(&shared.db);
        let Some(db) = db.as_mut() else { return };
        while let Some(first) = take(shared) {
            run_batch(db, shared, first);
        }
    }
}

/// A blocking caller's turn as the writer: with the store held, runs
/// batches from the head of the queue until the caller's own unit has been
/// settled. Units queued behind it are left to the writer thread, which is
/// woken if any remain.
pub(crate) fn lead<R>(
    shared: &Shared,
    mut db: MutexGuard<'_, Option<ProducerDb>>,
    own: &Ticket<R>,
) {
    if let Some(db) = db.as_mut() {
        while lock(&own.slot).phase != Phase::Done {
            let Some(first) = take(shared) else { break };
            run_batch(db, shared, first);
        }
    }
    drop(db);
    let queue = lock(&shared.queue);
    if !queue.jobs.is_empty() && queue.writer_waiting {
        shared.work.notify_one();
    }
}

/// A lone caller's unit, run directly on the held store because the queue
/// was empty and no batch was running: its own `BEGIN IMMEDIATE`
/// transaction, as the first unit of a batch runs (no savepoint, the same
/// crash points, the same outcomes), without queueing it or waking anyone.
/// Callers that arrive meanwhile queue their units for the writer thread.
pub(crate) fn alone<T, E, F>(db: &mut ProducerDb, f: F) -> Outcome<T, E>
where
    F: FnOnce(&mut ProducerTx<'_>) -> Result<T, E>,
{
    let mut outcome = None;
    let ended = db.write(|ptx| -> Result<(), StoreError> {
        let ran = run_caught(ptx, f);
        let kept = ran.is_ok();
        outcome = Some(ran);
        still_open(ptx)?;
        if !kept {
            return Err(first_failed());
        }
        crash::point(crash::PRODUCER_GROUP_BEFORE_COMMIT);
        Ok(())
    });
    if ended.is_ok() {
        // Committed and durable; the caller has not been told yet.
        crash::point(crash::PRODUCER_GROUP_AFTER_COMMIT);
    }
    settled(outcome, ended.as_ref().map(|_| ()))
}

struct CloseOnDrop<'a>(&'a Shared);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        let jobs = {
            let mut queue = lock(&self.0.queue);
            queue.closed = true;
            std::mem::take(&mut queue.jobs)
        };
        self.0.room.notify_all();
        // Each unit dropped unrun tells its caller `Closed`.
        drop(jobs);
    }
}

/// Waits until a unit is queued; false once the queue is closed and empty.
fn wait_for_work(shared: &Shared) -> bool {
    let mut queue = lock(&shared.queue);
    loop {
        if !queue.jobs.is_empty() {
            return true;
        }
        if queue.closed {
            return false;
        }
        queue.writer_waiting = true;
        queue = shared.work.wait(queue).unwrap_or_else(|e| e.into_inner());
        queue.writer_waiting = false;
    }
}

/// The next unit in arrival order, marked taken, if any. Called only with
/// the store held.
fn take(shared: &Shared) -> Option<Box<dyn Job>> {
    let mut queue = lock(&shared.queue);
    let job = queue.jobs.pop_front()?;
    job.mark_taken();
    let room_waiters = queue.room_waiters;
    drop(queue);
    if room_waiters > 0 {
        shared.room.notify_one();
    }
    Some(job)
}

/// Runs `first` and the units queued behind it, within the bounds, in one
/// transaction; then tells every caller its outcome.
///
/// The first unit runs without a savepoint: the transaction is its
/// savepoint. If it fails, the transaction (holding nothing else) is rolled
/// back, its caller told, and the units behind it go to the next batch. So
/// a lone unit costs what a direct `write` costs.
fn run_batch(db: &mut ProducerDb, shared: &Shared, first: Box<dyn Job>) {
    let options = &shared.options;
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(options.batch_len_max.min(1024));
    let mut next = Some(first);
    let ended = db.write(|ptx| -> Result<(), StoreError> {
        let started = Instant::now();
        let mut kept = 0usize;
        while let Some(mut job) = next.take() {
            let alone = batch.is_empty();
            let ran = job.run(ptx, !alone);
            batch.push(job);
            match ran? {
                Ran::Kept => kept += 1,
                Ran::Undone => {}
                Ran::Failed => return Err(first_failed()),
            }
            if batch.len() < options.batch_len_max && started.elapsed() < options.batch_time_max {
                next = take(shared);
            }
        }
        if kept > 0 {
            crash::point(crash::PRODUCER_GROUP_BEFORE_COMMIT);
        }
        Ok(())
    });
    if ended.is_ok() {
        // Committed and durable; no caller has been told yet.
        crash::point(crash::PRODUCER_GROUP_AFTER_COMMIT);
    }
    // A unit taken but not run (the transaction could not begin) ends
    // with the same error as the batch.
    batch.extend(next);
    debug_assert!(batch.len() <= options.batch_len_max);
    for job in batch {
        job.settle(ended.as_ref().map(|_| ()));
    }
}

/// The transaction's error when its first unit failed and it was rolled
/// back for it; that unit's caller gets its own error instead.
fn first_failed() -> StoreError {
    StoreError::new(
        ordo_core::ErrorKind::Other,
        "producer: the group transaction was rolled back for its first unit's failure",
    )
}
