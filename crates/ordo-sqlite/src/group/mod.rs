//! Group commit: one writer per producer store, shared by any number of
//! threads and async tasks, that commits many callers' units of work in one
//! transaction, so that they share one sync of the disk.
//!
//! A caller submits a unit, a closure over the [`ProducerTx`] as with
//! [`ProducerDb::write`]: its own writes and its appends. The writer takes
//! units in arrival order, runs each under its own savepoint inside one
//! `BEGIN IMMEDIATE` transaction, up to [`GroupOptions::batch_len_max`]
//! units or [`GroupOptions::batch_time_max`], commits (`synchronous=FULL`),
//! and only then hands each caller its result. A unit that fails (its own
//! error, a refused append, a panic) is rolled back to its savepoint and
//! fails alone; the others of the batch commit, in order. Every guarantee of
//! `write` holds per unit: its state and its events commit together, each
//! flow's seqs stay contiguous, and `Ok` means durable.
//!
//! Who runs a batch: a writer thread, or, when the store is idle, the
//! blocking caller of [`GroupWriter::submit`] itself. A lone caller, that
//! finds the queue empty and no batch running, runs its unit directly in
//! its own `BEGIN IMMEDIATE` transaction, without queueing it: what a
//! direct [`ProducerDb::write`] costs, with the same crash points and
//! outcomes as a batch of one; callers that arrive meanwhile queue their
//! units for the writer thread. One that finds units queued but the store
//! idle queues its own and runs the batch at the head of the queue (its own
//! unit and any queued before or with it) without handing it to another
//! thread and back. Either way units are taken in arrival order by whoever
//! holds the store, one batch at a time. [`GroupWriter::enqueue`] (and so
//! every async caller) always leaves its unit to the writer thread.
//!
//! Bounds: the queue holds at most [`GroupOptions::queue_len_max`] units; a
//! submit to a full queue waits for room or is refused
//! ([`WhenFull`]). A caller waits at most [`GroupOptions::wait_max`] for the
//! writer to take its unit: past it, the unit is withdrawn from the queue and
//! never runs ([`SubmitError::TimedOut`]). Once taken, the unit runs in the
//! next transaction and its caller waits for that transaction's outcome,
//! whatever the time: a caller is never left not knowing whether its unit
//! committed.

mod ticket;
mod unit;
mod writer;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ordo_core::StoreError;

use crate::producer::{ProducerDb, ProducerTx};
use ticket::{left, lock, wait_at_most, Phase, Queue, Ticket};
use unit::{Outcome, Unit};

/// Units per transaction, unless set otherwise.
pub const BATCH_LEN_MAX_DEFAULT: usize = 1_000;
/// How long the writer keeps taking units into one transaction, from its
/// first unit, unless set otherwise.
pub const BATCH_TIME_MAX_DEFAULT: Duration = Duration::from_millis(5);
/// Units the queue holds, unless set otherwise.
pub const QUEUE_LEN_MAX_DEFAULT: usize = 10_000;
/// How long a caller waits for the writer to take its unit, unless set
/// otherwise.
pub const WAIT_MAX_DEFAULT: Duration = Duration::from_secs(30);
/// The WAL size, in pages, past which the writer's commit checkpoints,
/// unless set otherwise: SQLite's own default, 4 MiB at 4 KiB pages.
pub const WAL_CHECKPOINT_PAGES_DEFAULT: u32 = 1_000;

/// What a submit to a full queue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Waits for room, within the caller's [`GroupOptions::wait_max`].
    Block,
    /// Fails at once with [`SubmitError::QueueFull`].
    Refuse,
}

/// The bounds of a [`GroupWriter`].
#[derive(Debug, Clone)]
pub struct GroupOptions {
    /// The most units in one transaction (default
    /// [`BATCH_LEN_MAX_DEFAULT`]), at least 1.
    pub batch_len_max: usize,
    /// The writer stops taking units into a transaction this long after its
    /// first unit started, and commits (default [`BATCH_TIME_MAX_DEFAULT`]).
    /// It never waits for units to arrive: a transaction holds what was
    /// queued while the previous one committed.
    pub batch_time_max: Duration,
    /// The most units waiting in the queue (default
    /// [`QUEUE_LEN_MAX_DEFAULT`]), at least 1.
    pub queue_len_max: usize,
    /// What a submit to a full queue does (default [`WhenFull::Block`]).
    pub when_full: WhenFull,
    /// How long a caller waits, from its submit, for room in the queue and
    /// for the writer to take its unit (default [`WAIT_MAX_DEFAULT`]).
    pub wait_max: Duration,
    /// The writer's connection checkpoints once the WAL holds this many
    /// pages (SQLite's `wal_autocheckpoint`; default
    /// [`WAL_CHECKPOINT_PAGES_DEFAULT`], a store's own default too), at
    /// least 1. A larger WAL is checkpointed less often, each page once
    /// however often batches rewrote it, which helps when each batch writes
    /// many scattered pages (random flow ids); but the WAL then grows
    /// larger, a checkpoint takes longer, and the commit that runs it is
    /// late: at 64 producers, 10,000 pages measured 23 % faster with random
    /// flow ids and 12 to 16 % slower with sequential ones, with a p99.9 of
    /// 16 ms against 4 ms. Other connections to the store keep
    /// their own setting.
    pub wal_checkpoint_pages: u32,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            batch_len_max: BATCH_LEN_MAX_DEFAULT,
            batch_time_max: BATCH_TIME_MAX_DEFAULT,
            queue_len_max: QUEUE_LEN_MAX_DEFAULT,
            when_full: WhenFull::Block,
            wait_max: WAIT_MAX_DEFAULT,
            wal_checkpoint_pages: WAL_CHECKPOINT_PAGES_DEFAULT,
        }
    }
}

/// Why a submitted unit did not commit. Each variant says whether the unit
/// ran; none leaves it unknown, except a store error of kind
/// `CommitOutcomeUnknown`, as with [`ProducerDb::write`].
#[derive(Debug)]
pub enum SubmitError<E> {
    /// The unit returned this error: its writes were rolled back to its
    /// savepoint, and the other units of its transaction were not affected.
    Unit(E),
    /// The unit panicked: its writes were rolled back to its savepoint, and
    /// the writer went on with the other units.
    Panicked(String),
    /// The transaction that held the unit could not begin or commit: nothing
    /// of it was kept (unless the kind is `CommitOutcomeUnknown`).
    Store(StoreError),
    /// The queue was full ([`WhenFull::Refuse`]): the unit was not queued
    /// and never runs.
    QueueFull,
    /// The caller's [`GroupOptions::wait_max`] passed before the writer took
    /// the unit: it was withdrawn from the queue (or never entered it) and
    /// never runs.
    TimedOut,
    /// The writer has stopped: the unit was not run.
    Closed,
}

impl<E: fmt::Display> fmt::Display for SubmitError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::Unit(e) => write!(f, "{e}"),
            SubmitError::Panicked(message) => {
                write!(f, "the unit panicked and was rolled back: {message}")
            }
            SubmitError::Store(e) => write!(f, "{e}"),
            SubmitError::QueueFull => {
                f.write_str("the group commit queue is full: the unit was not queued")
            }
            SubmitError::TimedOut => f.write_str(
                "timed out before the writer took the unit: it was withdrawn and never runs",
            ),
            SubmitError::Closed => {
                f.write_str("the group writer has stopped: the unit was not run")
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for SubmitError<E> {}

/// What the callers and the writer share.
pub(crate) struct Shared {
    pub queue: Mutex<Queue>,
    /// Raised when a unit is queued or the queue closes.
    pub work: Condvar,
    /// Raised when room is made in the queue.
    pub room: Condvar,
    pub options: GroupOptions,
    /// The store, held by whoever runs a batch; `None` once closed.
    pub db: Mutex<Option<ProducerDb>>,
}

/// The group-committing producer handle: one writer thread and a
/// [`ProducerDb`] that it (or an idle-time caller) runs batches on, shared by reference (`&GroupWriter` is `Send + Sync`) by
/// any number of callers. Dropping it, or [`GroupWriter::close`], runs the
/// units already queued, then stops the writer.
pub struct GroupWriter {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    /// The store's checkpoint setting before the writer changed it.
    own_checkpoint_pages: u32,
}

impl GroupWriter {
    /// Starts the writer on its own thread with `db`, which it owns until
    /// [`GroupWriter::close`] gives it back (with its own checkpoint
    /// setting again).
    pub fn start(db: ProducerDb, options: GroupOptions) -> Result<GroupWriter, StoreError> {
        let options = GroupOptions {
            batch_len_max: options.batch_len_max.max(1),
            queue_len_max: options.queue_len_max.max(1),
            wal_checkpoint_pages: options.wal_checkpoint_pages.max(1),
            ..options
        };
        let own_checkpoint_pages = checkpoint_pages(&db, None)?;
        checkpoint_pages(&db, Some(options.wal_checkpoint_pages))?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: Default::default(),
                closed: false,
                next_id: 0,
                writer_waiting: false,
                room_waiters: 0,
            }),
            work: Condvar::new(),
            room: Condvar::new(),
            options,
            db: Mutex::new(Some(db)),
        });
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ordo-group-writer".into())
                .spawn(move || writer::run(&shared))
                .expect("the writer thread starts")
        };
        Ok(GroupWriter {
            shared,
            writer: Some(writer),
            own_checkpoint_pages,
        })
    }

    /// The options in force.
    pub fn options(&self) -> &GroupOptions {
        &self.shared.options
    }

    /// Submits `unit` and waits for its outcome: `Ok` once the transaction
    /// that holds it has committed and is durable. When no batch is running,
    /// the calling thread runs the batch itself.
    pub fn submit<T, E, F>(&self, unit: F) -> Result<T, SubmitError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&mut ProducerTx<'_>) -> Result<T, E> + Send + 'static,
    {
        let unit = match self.run_alone(unit) {
            Ok(outcome) => return outcome,
            Err(unit) => unit,
        };
        let (pending, writer_waiting) = self.queue_unit(unit)?;
        match self.idle_store() {
            Some(db) => writer::lead(&self.shared, db, &pending.ticket),
            // A batch is running: the writer thread takes this unit after it.
            None => self.wake_writer(writer_waiting),
        }
        pending.wait()
    }

    /// The store, held, if no batch is running.
    fn idle_store(&self) -> Option<MutexGuard<'_, Option<ProducerDb>>> {
        match self.shared.db.try_lock() {
            Ok(db) => Some(db),
            Err(TryLockError::Poisoned(db)) => Some(db.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Runs `unit` on the calling thread in its own transaction if the
    /// store is idle and the queue empty; otherwise gives it back, to be
    /// queued. Units queued meanwhile wait for the writer thread, which is
    /// woken when this one is done if it is waiting.
    fn run_alone<T, E, F>(&self, unit: F) -> Result<Outcome<T, E>, F>
    where
        F: FnOnce(&mut ProducerTx<'_>) -> Result<T, E>,
    {
        let Some(mut db) = self.idle_store() else {
            return Err(unit);
        };
        {
            let queue = lock(&self.shared.queue);
            if queue.closed {
                return Ok(Err(SubmitError::Closed));
            }
            if !queue.jobs.is_empty() {
                return Err(unit);
            }
        }
        let Some(store) = db.as_mut() else {
            return Ok(Err(SubmitError::Closed));
        };
        let outcome = writer::alone(store, unit);
        drop(db);
        let queue = lock(&self.shared.queue);
        let writer_waiting = !queue.jobs.is_empty() && queue.writer_waiting;
        drop(queue);
        self.wake_writer(writer_waiting);
        Ok(outcome)
    }

    /// Queues `unit` and returns at once with its [`Pending`] outcome, to
    /// wait for ([`Pending::wait`]) or to await (it is a `Future`). With
    /// [`WhenFull::Block`] a full queue blocks this call (within
    /// [`GroupOptions::wait_max`]); async callers use [`WhenFull::Refuse`].
    pub fn enqueue<T, E, F>(&self, unit: F) -> Result<Pending<T, E>, SubmitError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&mut ProducerTx<'_>) -> Result<T, E> + Send + 'static,
    {
        let (pending, writer_waiting) = self.queue_unit(unit)?;
        self.wake_writer(writer_waiting);
        Ok(pending)
    }

    /// Wakes the writer thread if it was waiting when the unit was queued;
    /// otherwise it will find the unit before it waits.
    fn wake_writer(&self, writer_waiting: bool) {
        if writer_waiting {
            self.shared.work.notify_one();
        }
    }

    /// Queues `unit` behind every unit submitted before it, waking nobody;
    /// also says whether the writer thread was waiting for work then.
    fn queue_unit<T, E, F>(&self, unit: F) -> Result<(Pending<T, E>, bool), SubmitError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&mut ProducerTx<'_>) -> Result<T, E> + Send + 'static,
    {
        let deadline = Instant::now() + self.shared.options.wait_max;
        let mut queue = self.room_in_queue(deadline)?;
        let ticket = Ticket::new(queue.next_id);
        queue.next_id += 1;
        queue.jobs.push_back(Box::new(Unit {
            f: Some(unit),
            outcome: None,
            ticket: ticket.clone(),
        }));
        let writer_waiting = queue.writer_waiting;
        drop(queue);
        let pending = Pending {
            shared: self.shared.clone(),
            ticket,
            deadline,
        };
        Ok((pending, writer_waiting))
    }

    /// The queue, locked, once it has room.
    fn room_in_queue<E>(
        &self,
        deadline: Instant,
    ) -> Result<std::sync::MutexGuard<'_, Queue>, SubmitError<E>> {
        let options = &self.shared.options;
        let mut queue = lock(&self.shared.queue);
        loop {
            if queue.closed {
                return Err(SubmitError::Closed);
            }
            if queue.jobs.len() < options.queue_len_max {
                return Ok(queue);
            }
            if options.when_full == WhenFull::Refuse {
                return Err(SubmitError::QueueFull);
            }
            let Some(wait) = left(deadline) else {
                return Err(SubmitError::TimedOut);
            };
            queue.room_waiters += 1;
            queue = wait_at_most(&self.shared.room, queue, wait);
            queue.room_waiters -= 1;
        }
    }

    /// Units queued and not yet taken by the writer.
    pub fn queued(&self) -> usize {
        lock(&self.shared.queue).jobs.len()
    }

    /// Stops accepting units, lets the writer run those already queued, and
    /// returns its store.
    pub fn close(mut self) -> ProducerDb {
        self.stop().expect("the writer is still running")
    }

    fn stop(&mut self) -> Option<ProducerDb> {
        lock(&self.shared.queue).closed = true;
        self.shared.work.notify_all();
        self.shared.room.notify_all();
        let writer = self.writer.take()?;
        // The writer ran every queued unit; no caller can lead any more.
        writer.join().ok()?;
        let db = lock(&self.shared.db).take()?;
        // Best effort: the setting only tunes this connection's checkpoints.
        let _ = checkpoint_pages(&db, Some(self.own_checkpoint_pages));
        Some(db)
    }
}

impl Drop for GroupWriter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads the connection's `wal_autocheckpoint`, after setting it to
/// `pages` if given.
fn checkpoint_pages(db: &ProducerDb, pages: Option<u32>) -> Result<u32, StoreError> {
    let sql = match pages {
        Some(pages) => format!("PRAGMA wal_autocheckpoint = {pages}"),
        None => "PRAGMA wal_autocheckpoint".to_string(),
    };
    db.connection()
        .query_row(&sql, [], |row| row.get::<_, i64>(0))
        .map(|pages| u32::try_from(pages.max(0)).unwrap_or(u32::MAX))
        .map_err(|e| StoreError::sqlite("producer: cannot set wal_autocheckpoint", e))
}

/// A queued unit's outcome, to come. Dropping it before the writer took the
/// unit withdraws the unit (it never runs); once taken, the unit runs and
/// commits or not whether anyone waits.
pub struct Pending<T, E> {
    shared: Arc<Shared>,
    ticket: Arc<Ticket<Outcome<T, E>>>,
    deadline: Instant,
}

impl<T, E> Pending<T, E> {
    /// Waits for the outcome. Past the submit's [`GroupOptions::wait_max`],
    /// a unit not yet taken is withdrawn and the answer is
    /// [`SubmitError::TimedOut`]; a unit taken is waited for until its
    /// transaction ends.
    pub fn wait(self) -> Outcome<T, E> {
        let mut slot = lock(&self.ticket.slot);
        loop {
            if let Some(outcome) = slot.result.take() {
                return outcome;
            }
            slot.waiting = true;
            if slot.phase != Phase::Queued {
                slot = self
                    .ticket
                    .ready
                    .wait(slot)
                    .unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let Some(wait) = left(self.deadline) else {
                drop(slot);
                if self.withdraw() {
                    return Err(SubmitError::TimedOut);
                }
                slot = lock(&self.ticket.slot);
                continue;
            };
            slot = wait_at_most(&self.ticket.ready, slot, wait);
        }
    }

    /// Withdraws the unit if the writer has not taken it yet; returns
    /// whether it did (the unit then never runs).
    pub fn withdraw(&self) -> bool {
        let mut queue = lock(&self.shared.queue);
        {
            let mut slot = lock(&self.ticket.slot);
            if slot.phase != Phase::Queued {
                return false;
            }
            slot.phase = Phase::Withdrawn;
        }
        let withdrawn = queue.withdraw(self.ticket.id);
        let room_waiters = queue.room_waiters;
        drop(queue);
        if room_waiters > 0 {
            self.shared.room.notify_one();
        }
        withdrawn
    }
}

impl<T, E> Drop for Pending<T, E> {
    fn drop(&mut self) {
        let queued = lock(&self.ticket.slot).phase == Phase::Queued;
        if queued {
            self.withdraw();
        }
    }
}

impl<T, E> Future for Pending<T, E> {
    type Output = Outcome<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = lock(&self.ticket.slot);
        match slot.result.take() {
            Some(outcome) => Poll::Ready(outcome),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
