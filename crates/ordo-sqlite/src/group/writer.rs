//! The writer thread: takes units in arrival order, runs a batch of them in
//! one transaction, commits, then settles each.

use std::time::Instant;

use ordo_core::{crash, StoreError};

use super::ticket::{lock, Job, Ran};
use super::Shared;
use crate::producer::ProducerDb;

/// Runs batches until the queue is closed and empty; returns the store.
pub(crate) fn run(mut db: ProducerDb, shared: &Shared) -> ProducerDb {
    // A writer that unwinds (never by a unit's panic, which is caught)
    // still tells every queued caller that its unit was not run.
    let _guard = CloseOnDrop(shared);
    while let Some(first) = take(shared, true) {
        run_batch(&mut db, shared, first);
    }
    db
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

/// The next unit in arrival order, marked taken; with `block`, waits for
/// one unless the queue is closed and empty.
fn take(shared: &Shared, block: bool) -> Option<Box<dyn Job>> {
    let mut queue = lock(&shared.queue);
    loop {
        if let Some(job) = queue.jobs.pop_front() {
            job.mark_taken();
            drop(queue);
            shared.room.notify_one();
            return Some(job);
        }
        if queue.closed || !block {
            return None;
        }
        queue = shared.work.wait(queue).unwrap_or_else(|e| e.into_inner());
    }
}

/// Runs `first` and the units queued behind it, within the bounds, in one
/// transaction; then tells every caller its outcome.
fn run_batch(db: &mut ProducerDb, shared: &Shared, first: Box<dyn Job>) {
    let options = &shared.options;
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(options.batch_len_max.min(1024));
    let mut next = Some(first);
    let ended = db.write(|ptx| -> Result<(), StoreError> {
        let started = Instant::now();
        let mut kept = 0usize;
        while let Some(mut job) = next.take() {
            let ran = job.run(ptx);
            batch.push(job);
            kept += usize::from(matches!(ran?, Ran::Kept));
            if batch.len() < options.batch_len_max && started.elapsed() < options.batch_time_max {
                next = take(shared, false);
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
    for job in batch {
        job.settle(ended.as_ref().map(|_| ()));
    }
}
