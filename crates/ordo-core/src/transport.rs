//! The seam between the relay and a consumer: a transport hands a round of
//! envelopes over and brings one receipt per envelope back.
//!
//! A consumer store in the same process is a transport (every
//! [`ConsumerStore`] is one); an HTTP client is another, in its own crate.
//! The relay's logic (fair order, backoff, quarantine, custody only on
//! `accepted` or `duplicate`) sees only [`Transport::deliver`] and its
//! [`TransportError`]. A consumer store in the same process is always of
//! this release; a network transport tells a consumer of an earlier one
//! ([`TransportError::Skew`]).
//!
//! Invariant: a transport never decides custody. It returns the consumer's
//! receipts, or says why there are none; the relay records what they mean.

use std::fmt;

use crate::envelope::Envelope;
use crate::error::{ErrorKind, StoreError};
use crate::identity::StoreId;
use crate::outcome::Receipt;
use crate::store::ConsumerStore;

/// Hands rounds of envelopes to a consumer.
pub trait Transport {
    /// Hands `events` of the producer store `sender` (`None`: unknown)
    /// over as one unit and returns the consumer's receipt for each, in
    /// input order, issued after its durable commit. An error means nothing
    /// is known to have been stored (a retry is safe: the consumer answers
    /// `duplicate` for what did commit).
    fn deliver(
        &mut self,
        sender: Option<&StoreId>,
        events: &[Envelope],
    ) -> Result<Vec<Receipt>, TransportError>;

    /// The identity of the consumer store whose receipts the last
    /// [`deliver`](Transport::deliver) returned, which the producer records
    /// for the destination at its first delivery and enforces afterwards;
    /// `None` when unknown (a consumer of an earlier release). The default
    /// knows none.
    fn consumer_identity(&self) -> Option<StoreId> {
        None
    }

    /// The identity of the consumer store a delivery would reach, asked of
    /// it before the first delivery when the transport can (so that the
    /// relay refuses the wrong consumer before handing it anything);
    /// `None` when unknown. The default is what
    /// [`consumer_identity`](Transport::consumer_identity) knows.
    fn identify(&mut self) -> Result<Option<StoreId>, TransportError> {
        Ok(self.consumer_identity())
    }
}

/// A consumer store in the same process is a transport: one receive
/// transaction per round.
impl<C: ConsumerStore + ?Sized> Transport for C {
    fn deliver(
        &mut self,
        sender: Option<&StoreId>,
        events: &[Envelope],
    ) -> Result<Vec<Receipt>, TransportError> {
        let answers = self.receive_from(sender, events)?;
        Ok(answers.into_iter().map(|a| a.receipt).collect())
    }

    fn consumer_identity(&self) -> Option<StoreId> {
        Some(self.store_id().clone())
    }
}

/// What went wrong in a transient failure, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransientKind {
    /// The consumer's store was busy (locked past its timeout), or the
    /// consumer said it is overloaded.
    Busy,
    /// The consumer could not be reached, or the connection broke.
    Connection,
    /// No answer in time.
    Timeout,
    /// An HTTP status worth retrying (408, 429, 5xx).
    Http,
    /// Anything else worth retrying.
    Other,
}

impl TransientKind {
    /// The kind's label value (`busy|connection|timeout|http|other`).
    pub fn as_str(self) -> &'static str {
        match self {
            TransientKind::Busy => "busy",
            TransientKind::Connection => "connection",
            TransientKind::Timeout => "timeout",
            TransientKind::Http => "http",
            TransientKind::Other => "other",
        }
    }
}

/// Why a round brought no receipts back.
#[derive(Debug)]
#[non_exhaustive]
pub enum TransportError {
    /// Worth retrying later: the round's events back off, other flows go on.
    Transient {
        /// What went wrong.
        kind: TransientKind,
        /// The consumer's or the connection's words.
        message: String,
        /// The consumer asked for at least this wait (HTTP `Retry-After`).
        retry_after_ms: Option<u64>,
    },
    /// The round is too large for the consumer (HTTP 413): the relay splits
    /// it, and quarantines an event too large alone.
    TooLarge {
        /// The consumer's words.
        message: String,
    },
    /// The consumer refused the event at `index` of the round (HTTP 400 with
    /// an index: the two sides' codecs disagree); it stored nothing.
    Rejected {
        /// The event's position in the round.
        index: usize,
        /// The consumer's words.
        message: String,
    },
    /// The consumer refuses every round (wrong key, wrong address, a request
    /// it cannot read): a configuration error; the run stops, nothing is
    /// marked.
    Refused {
        /// What to fix.
        message: String,
    },
    /// A store error that is not transient.
    Store(StoreError),
    /// The consumer is of an earlier release and cannot read this round's
    /// envelopes (they name a producer or carry headers, PROTOCOL.md
    /// section 12): a version skew. The round was not sent; the run stops,
    /// nothing is marked or quarantined.
    Skew {
        /// What was found, and what to do.
        message: String,
    },
}

impl From<StoreError> for TransportError {
    fn from(error: StoreError) -> Self {
        let kind = match error.kind() {
            ErrorKind::Busy => TransientKind::Busy,
            ErrorKind::ConnectionLost => TransientKind::Connection,
            _ => return TransportError::Store(error),
        };
        TransportError::Transient {
            kind,
            message: error.to_string(),
            retry_after_ms: None,
        }
    }
}

impl TransportError {
    /// The storage failure kind this error stands for, if any: a busy
    /// consumer is [`ErrorKind::Busy`], an unreachable one
    /// [`ErrorKind::ConnectionLost`].
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            TransportError::Transient { kind, .. } => Some(match kind {
                TransientKind::Busy => ErrorKind::Busy,
                TransientKind::Connection | TransientKind::Timeout => ErrorKind::ConnectionLost,
                TransientKind::Http | TransientKind::Other => ErrorKind::Other,
            }),
            TransportError::Store(error) => Some(error.kind()),
            _ => None,
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::Transient { kind, message, .. } => {
                write!(f, "{} (transient, {})", message, kind.as_str())
            }
            TransportError::TooLarge { message } => write!(f, "too large: {message}"),
            TransportError::Rejected { index, message } => {
                write!(f, "event {index} of the round rejected: {message}")
            }
            TransportError::Refused { message } => f.write_str(message),
            TransportError::Store(error) => error.fmt(f),
            TransportError::Skew { message } => write!(f, "version skew: {message}"),
        }
    }
}

impl std::error::Error for TransportError {}
