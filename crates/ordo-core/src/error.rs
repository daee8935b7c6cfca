//! Operating failures, backend-neutral.

use std::error::Error as StdError;
use std::fmt;

use crate::ids::EventId;
use crate::reservation::AdvanceRefused;

/// What kind of storage failure happened, so that callers can decide whether
/// to retry without matching on a backend's codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Another writer holds the lock past the busy timeout; retrying may succeed.
    Busy,
    /// The database could not be reached or opened.
    ConnectionLost,
    /// The database cannot be written.
    ReadOnly,
    /// The disk is full.
    DiskFull,
    /// The file is damaged or not a database.
    Corrupt,
    /// A commit was sent but whether it took effect is unknown.
    CommitOutcomeUnknown,
    /// The database is not an ordo database of the expected role or version
    /// (another program's file, a foreign SQLite file not adopted, the other
    /// role, a newer schema), or refuses the durability settings ordo
    /// requires. Nothing was written to it.
    Incompatible,
    /// The store does not exist and creating it was not asked for; nothing
    /// was created.
    NotFound,
    /// Anything else the backend reported.
    Other,
}

/// A storage failure, with the backend's own message.
#[derive(Debug)]
pub struct StoreError {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl StoreError {
    /// A failure of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> StoreError {
        StoreError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A failure caused by a backend error.
    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> StoreError {
        StoreError {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// Why an advance failed (as opposed to a protocol outcome).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdvanceError {
    /// The request is refused by the flow's state; nothing was written.
    #[error(transparent)]
    Refused(#[from] AdvanceRefused),
    /// The store failed; nothing was committed unless the kind is
    /// `CommitOutcomeUnknown`.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a relay run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// `--event` named an event that is not in the outbox.
    #[error("--event {0}: no such event in the outbox")]
    UnknownEvent(EventId),
    /// A store failed. Deliveries before the failure stand.
    #[error(transparent)]
    Store(#[from] StoreError),
}
