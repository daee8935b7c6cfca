//! A caller's unit of work, typed: run under a savepoint, its result kept
//! until the transaction that holds it has ended.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ordo_core::{ErrorKind, StoreError};

use super::ticket::{lock, Job, Phase, Ran, Ticket};
use super::SubmitError;
use crate::conn::sql_error;
use crate::producer::ProducerTx;

/// The result a caller receives.
pub(crate) type Outcome<T, E> = Result<T, SubmitError<E>>;

/// A unit: the caller's closure, then its result until it is settled.
pub(crate) struct Unit<T, E, F> {
    pub f: Option<F>,
    pub outcome: Option<Outcome<T, E>>,
    pub ticket: Arc<Ticket<Outcome<T, E>>>,
}

/// A copy of a transaction's error for each of its callers.
pub(crate) fn copy(error: &StoreError) -> StoreError {
    StoreError::new(error.kind(), error.to_string())
}

fn savepoint(ptx: &mut ProducerTx<'_>, sql: &'static str) -> Result<(), StoreError> {
    ptx.run_held(sql)
        .map_err(|e| sql_error("producer: group commit savepoint", e))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a unit panicked".to_string())
}

/// Runs a unit's closure, its error or panic caught as its outcome.
pub(crate) fn run_caught<T, E, F>(ptx: &mut ProducerTx<'_>, f: F) -> Outcome<T, E>
where
    F: FnOnce(&mut ProducerTx<'_>) -> Result<T, E>,
{
    match catch_unwind(AssertUnwindSafe(|| f(ptx))) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(SubmitError::Unit(error)),
        Err(payload) => Err(SubmitError::Panicked(panic_message(payload.as_ref()))),
    }
}

/// An error that made SQLite roll the whole transaction back (a full disk,
/// an I/O error) leaves no savepoint to return to and nothing to commit:
/// the transaction cannot go on.
pub(crate) fn still_open(ptx: &ProducerTx<'_>) -> Result<(), StoreError> {
    if ptx.sql().is_autocommit() {
        return Err(StoreError::new(
            ErrorKind::Other,
            "producer: a unit's failure ended the group transaction",
        ));
    }
    Ok(())
}

/// What a unit's caller is told once the transaction that held it ended:
/// committed (`Ok`), its own result, kept or undone; not committed, its own
/// failure if it failed on its own, else the transaction's error. Nothing
/// of it was kept.
pub(crate) fn settled<T, E>(
    outcome: Option<Outcome<T, E>>,
    ended: Result<(), &StoreError>,
) -> Outcome<T, E> {
    match (outcome, ended) {
        (Some(outcome), Ok(())) => outcome,
        (Some(Err(SubmitError::Unit(e))), Err(_)) => Err(SubmitError::Unit(e)),
        (Some(Err(SubmitError::Panicked(message))), Err(_)) => Err(SubmitError::Panicked(message)),
        (_, Err(error)) => Err(SubmitError::Store(copy(error))),
        (None, Ok(())) => Err(SubmitError::Store(StoreError::new(
            ErrorKind::Other,
            "producer: a unit was settled without running",
        ))),
    }
}

impl<T, E, F> Job for Unit<T, E, F>
where
    T: Send + 'static,
    E: Send + 'static,
    F: FnOnce(&mut ProducerTx<'_>) -> Result<T, E> + Send + 'static,
{
    fn id(&self) -> u64 {
        self.ticket.id
    }

    fn mark_taken(&self) {
        lock(&self.ticket.slot).phase = Phase::Taken;
    }

    fn run(&mut self, ptx: &mut ProducerTx<'_>, under_savepoint: bool) -> Result<Ran, StoreError> {
        let f = self.f.take().expect("a unit runs once");
        if under_savepoint {
            savepoint(ptx, "SAVEPOINT ordo_unit")?;
        }
        let outcome = run_caught(ptx, f);
        let kept = outcome.is_ok();
        self.outcome = Some(outcome);
        still_open(ptx)?;
        if !under_savepoint {
            return Ok(if kept { Ran::Kept } else { Ran::Failed });
        }
        if !kept {
            savepoint(ptx, "ROLLBACK TO ordo_unit")?;
        }
        savepoint(ptx, "RELEASE ordo_unit")?;
        Ok(if kept { Ran::Kept } else { Ran::Undone })
    }

    fn settle(mut self: Box<Self>, ended: Result<(), &StoreError>) {
        let outcome = settled(self.outcome.take(), ended);
        self.ticket.fill(outcome);
    }
}

impl<T, E, F> Drop for Unit<T, E, F> {
    /// A unit dropped without being settled (the writer stopped before its
    /// transaction began, or unwound before it committed) never ran in a
    /// committed transaction: its caller is told so. A settled or
    /// withdrawn ticket ignores this.
    fn drop(&mut self) {
        self.ticket.fill(Err(SubmitError::Closed));
    }
}
