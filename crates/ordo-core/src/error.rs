//! Operating failures, backend-neutral.

use std::error::Error as StdError;
use std::fmt;

use crate::ids::{EventId, FlowId, Seq};

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
    /// A worker's claim on a flow (a relay's lease) was taken over by
    /// another worker: its bookkeeping write was refused and nothing was
    /// written. Not a failure of the store; the flow's new holder goes on.
    LeaseLost,
    /// The database is not an ordo database of the expected role or version
    /// (another program's file, a foreign SQLite file not adopted, the other
    /// role, a newer schema), or refuses the durability settings ordo
    /// requires. Nothing was written to it.
    Incompatible,
    /// The store does not exist and creating it was not asked for; nothing
    /// was created.
    NotFound,
    /// What the caller gave is not valid (a connection URL that does not
    /// parse, a schema name outside the safe set); nothing was done.
    InvalidInput,
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

    /// A corrupt store: what was being read (`context`), and what was
    /// wrong with it.
    pub fn corrupt(context: &str, detail: impl fmt::Display) -> StoreError {
        StoreError::new(ErrorKind::Corrupt, format!("{context}: {detail}"))
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

/// Why an append to the outbox was refused or failed. A refusal writes
/// nothing; the caller's transaction may go on or be dropped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// The event's seq is not its flow's last seq plus one: seqs stay
    /// contiguous per flow over committed events.
    #[error("cannot append seq {seq} to flow {flow_id} whose last seq is {last_seq}")]
    NotNext {
        /// The flow.
        flow_id: FlowId,
        /// The seq of the refused event.
        seq: Seq,
        /// The flow's last committed seq (0 if none).
        last_seq: i64,
    },
    /// The flow's seq would pass `i64::MAX`: allocation never wraps.
    #[error("flow {flow_id}: no seq is left after {}", i64::MAX)]
    SeqExhausted {
        /// The flow.
        flow_id: FlowId,
    },
    /// The event id is already in the outbox (under another flow or seq).
    #[error("event id {0} is already in the outbox")]
    EventIdUsed(EventId),
    /// The event type or payload breaks the envelope's rules.
    #[error("invalid event: {0}")]
    Invalid(String),
    /// The store failed.
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
    /// The consumer refuses every round: a configuration error (a wrong
    /// key or address, a request it cannot read). Nothing was marked.
    #[error("the consumer refused the delivery: {0}")]
    Refused(String),
    /// The consumer is of an earlier release than the round's envelopes
    /// need (they name a producer or carry headers): a version skew, to
    /// be ended by upgrading the consumer. The round was not sent, and
    /// nothing of it was marked or quarantined.
    #[error("version skew: {0}")]
    Skew(String),
    /// The consumer failed transiently, and recording that failure on the
    /// producer failed too: both errors, neither swallowed.
    #[error("{delivery}; recording the failure also failed: {recording}")]
    FailureUnrecorded {
        /// Why the round could not be delivered.
        delivery: crate::transport::TransportError,
        /// Why the failure could not be recorded.
        recording: StoreError,
    },
}

impl RelayError {
    /// The kind of the storage failure behind this error, if any.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            RelayError::UnknownEvent(_) | RelayError::Refused(_) | RelayError::Skew(_) => None,
            RelayError::Store(e) => Some(e.kind()),
            RelayError::FailureUnrecorded { delivery, .. } => delivery.kind(),
        }
    }
}

#[cfg(feature = "rusqlite")]
mod sqlite {
    use super::{ErrorKind, StoreError};
    use rusqlite::ErrorCode;

    /// The backend-neutral kind of an SQLite error.
    pub fn kind_of(error: &rusqlite::Error) -> ErrorKind {
        match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => ErrorKind::Busy,
            Some(ErrorCode::ReadOnly) => ErrorKind::ReadOnly,
            Some(ErrorCode::DiskFull) => ErrorKind::DiskFull,
            Some(ErrorCode::DatabaseCorrupt) | Some(ErrorCode::NotADatabase) => ErrorKind::Corrupt,
            Some(ErrorCode::CannotOpen) | Some(ErrorCode::PermissionDenied) => {
                ErrorKind::ConnectionLost
            }
            Some(ErrorCode::SystemIoFailure) => ErrorKind::CommitOutcomeUnknown,
            _ => ErrorKind::Other,
        }
    }

    impl StoreError {
        /// An SQLite error with what was being done, and the kind callers act
        /// on (`Busy`, `ReadOnly`, `DiskFull`, `Corrupt`, ...).
        pub fn sqlite(context: impl Into<String>, error: rusqlite::Error) -> StoreError {
            StoreError::with_source(kind_of(&error), context, error)
        }
    }

    /// Lets `?` turn an SQLite error into a [`StoreError`] of the right kind
    /// in an application's own code and in its apply handler.
    impl From<rusqlite::Error> for StoreError {
        fn from(error: rusqlite::Error) -> StoreError {
            StoreError::sqlite("SQLite", error)
        }
    }

    /// Lets `?` work on SQLite calls and on appends alike in a producer
    /// transaction that returns [`AppendError`](super::AppendError).
    impl From<rusqlite::Error> for super::AppendError {
        fn from(error: rusqlite::Error) -> super::AppendError {
            super::AppendError::Store(error.into())
        }
    }
}
