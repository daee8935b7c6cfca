//! How a store's loops hear of new work. A commit that gives a loop work
//! (a receive that stored at least one new event, an append) raises the
//! store's in-process [`Signal`] and, in the same round trip as its
//! `COMMIT`, sends one `NOTIFY` on the store's channel: PostgreSQL delivers
//! it when, and only if, the transaction commits. A handle asked
//! [`RunStore::changed_elsewhere`](ordo_core::RunStore::changed_elsewhere)
//! listens on that channel on a connection of its own, drained by a
//! thread of its own, and answers from a flag: no I/O on the loop's
//! thread.
//!
//! - The channel is `ordo_inbox_<schema>` for a consumer and
//!   `ordo_outbox_<schema>` for a producer (notifications are per database,
//!   so the database needs no part in it). A name longer than an
//!   identifier's 63 bytes keeps the start of the schema and ends with `_`
//!   and the 8 hex digits of the schema's 32-bit FNV-1a hash.
//! - The payload names the sending process and store signal (a hash of
//!   both): a listener passes by the notifications of its own process's
//!   handles that share its signal, which woke its loop already.
//! - The listener's thread reads every notification as it arrives, so
//!   that the server's notification queue never waits for it, whether the
//!   loop looks or not; it ends when the handle is dropped (within
//!   [`STOP_CHECK`]) or its connection fails.
//!
//! Invariant: a notification is only a hint to look, as a signal is: a
//! loop always reads the store to learn what there is to do, so a missed
//! notification (the listener down or not yet listening) delays work to
//! the loop's poll, and a spurious one costs one empty round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ordo_core::{ErrorKind, Signal, StoreError};
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;

use crate::conn::{describe, PgTx, Role};
use crate::error::pg_error;
use crate::tls::PgUrl;
use crate::url::redact_url;

/// PostgreSQL's longest identifier, in bytes.
const IDENTIFIER_MAX: usize = 63;
/// How often a listener's thread looks whether its handle is gone.
pub(crate) const STOP_CHECK: Duration = Duration::from_secs(1);
/// How long after a listener failed to open the next look tries again
/// (the looks in between answer `false`, leaving the work to the poll).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// What ends the `application_name` of a listening connection.
const LISTEN_SUFFIX: &str = "-listen";

/// The channel of the store of `role` in `schema` (see the module's
/// documentation): `[a-z0-9_]`, at most 63 bytes.
pub(crate) fn channel(role: Role, schema: &str) -> String {
    let prefix = match role {
        Role::Consumer => "ordo_inbox_",
        Role::Producer => "ordo_outbox_",
    };
    let whole = format!("{prefix}{schema}");
    if whole.len() <= IDENTIFIER_MAX {
        return whole;
    }
    let hash = format!("_{:08x}", fnv1a32(schema.as_bytes()));
    // A schema name is ASCII (checked when the store opens).
    let kept = IDENTIFIER_MAX - prefix.len() - hash.len();
    format!("{prefix}{}{hash}", &schema[..kept])
}

/// The 32-bit FNV-1a hash: fixed, so that every process and build derives
/// the same channel.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

/// The 64-bit FNV-1a hash.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// This process, told apart from any other (a process id is reused).
fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| fastrand::u64(..))
}

/// A store's wake-ups: its in-process signal, the `NOTIFY` its commits of
/// new work send, and its listener.
pub(crate) struct Wake {
    signal: Signal,
    /// `NOTIFY "<channel>", '<token>'; COMMIT`.
    notify_commit: String,
    watch: Watch,
}

impl Wake {
    /// The wake-ups of the store of `role` whose connection `conn` was
    /// opened from `url`.
    pub(crate) fn new(url: &str, role: Role, conn: &PgTx) -> Wake {
        let schema = conn.ordo_schema();
        // By the URL without its password: two handles on one store share
        // the signal.
        let key = format!("postgres:{}#{schema}", redact_url(url));
        let token = format!(
            "{:016x}",
            fnv1a64(format!("{}:{}:{key}", std::process::id(), process_nonce()).as_bytes())
        );
        let channel = channel(role, schema);
        let mut target = conn.target_url().clone();
        let name = format!("{}{LISTEN_SUFFIX}", conn.application_name());
        target.config_mut().application_name(&name);
        Wake {
            signal: Signal::for_key(key),
            notify_commit: format!("NOTIFY \"{channel}\", '{token}'; COMMIT"),
            watch: Watch {
                target,
                channel,
                token,
                listener: None,
                retry_at: None,
            },
        }
    }

    /// This process's signal of the store.
    pub(crate) fn signal(&self) -> Signal {
        self.signal.clone()
    }

    /// What ends a write transaction: for one that gave a loop work
    /// (`gave_work`), the `NOTIFY` and the `COMMIT` in one round trip; else
    /// the `COMMIT` alone.
    pub(crate) fn commit_statement(&self, gave_work: bool) -> &str {
        if gave_work {
            &self.notify_commit
        } else {
            "COMMIT"
        }
    }

    /// After such a transaction committed: wakes this process's loops.
    pub(crate) fn raise(&self) {
        self.signal.raise();
    }

    /// The channel its commits notify.
    pub(crate) fn channel(&self) -> &str {
        &self.watch.channel
    }

    /// Whether a notification from another process (or from a handle of
    /// this one that does not share this signal) arrived since the last
    /// call. The first call opens the listener and says yes: what was
    /// committed before it listened was not heard. A listener whose
    /// connection failed is reported once as the error, and opened again
    /// at a later call, at most once per [`RETRY_AFTER`].
    pub(crate) fn changed_elsewhere(&mut self) -> Result<bool, StoreError> {
        self.watch.changed()
    }
}

/// The listening side of a handle.
struct Watch {
    /// The store's server, with the listener's `application_name`.
    target: PgUrl,
    channel: String,
    /// The payload of this process's notifications through this signal.
    token: String,
    listener: Option<Listener>,
    /// When a listener that failed to open may be tried again.
    retry_at: Option<Instant>,
}

impl Watch {
    fn changed(&mut self) -> Result<bool, StoreError> {
        if let Some(listener) = &self.listener {
            let ended = (listener.shared.ended.lock())
                .unwrap_or_else(|e| e.into_inner())
                .take();
            return match ended {
                None => Ok(listener.shared.heard.swap(false, Ordering::AcqRel)),
                Some(error) => {
                    self.listener = None;
                    Err(error)
                }
            };
        }
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return Ok(false);
        }
        match Listener::start(&self.target, &self.channel, &self.token) {
            Ok(listener) => {
                self.listener = Some(listener);
                self.retry_at = None;
                Ok(true)
            }
            Err(e) => {
                self.retry_at = Some(Instant::now() + RETRY_AFTER);
                Err(e)
            }
        }
    }
}

/// What a listener's thread and its handle share.
#[derive(Default)]
struct Shared {
    /// A notification arrived since the handle last looked.
    heard: AtomicBool,
    /// The handle is gone.
    stop: AtomicBool,
    /// Why the thread ended, until the handle looks.
    ended: Mutex<Option<StoreError>>,
}

/// A connection listening on a channel, drained by its own thread.
struct Listener {
    shared: Arc<Shared>,
}

impl Listener {
    /// Connects, listens, and hands the connection to a new thread.
    fn start(target: &PgUrl, channel: &str, token: &str) -> Result<Listener, StoreError> {
        let server = describe(target.config());
        let context = format!("{server}: cannot listen on channel {channel}");
        let mut client = target
            .connect()
            .map_err(|e| pg_error(&format!("{context}: cannot connect"), e))?;
        client
            .batch_execute(&format!("LISTEN \"{channel}\""))
            .map_err(|e| pg_error(&context, e))?;
        let shared = Arc::new(Shared::default());
        let (theirs, token) = (shared.clone(), token.to_owned());
        let failed = format!("{server}: the connection listening on channel {channel} failed");
        std::thread::Builder::new()
            .name("ordo-listen".into())
            .spawn(move || listen(client, &theirs, &token, &failed))
            .map_err(|e| {
                StoreError::new(
                    ErrorKind::Other,
                    format!("{context}: cannot start its thread: {e}"),
                )
            })?;
        Ok(Listener { shared })
    }
}

impl Drop for Listener {
    /// Its thread ends within [`STOP_CHECK`], closing the connection.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
    }
}

/// The listener's thread: reads notifications until its handle is gone or
/// the connection fails, flagging those of other processes (and of this
/// process's handles under another signal).
fn listen(mut client: Client, shared: &Shared, token: &str, failed: &str) {
    let error = loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let next = client.notifications().timeout_iter(STOP_CHECK).next();
        match next {
            Ok(Some(notification)) => {
                if notification.payload() != token {
                    shared.heard.store(true, Ordering::Release);
                }
            }
            Ok(None) if client.is_closed() => {
                break StoreError::new(
                    ErrorKind::ConnectionLost,
                    format!("{failed} (the connection closed)"),
                )
            }
            Ok(None) => {}
            Err(e) => break pg_error(failed, e),
        }
    };
    tracing::debug!(error = %error, "a listener ends");
    *shared.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_is_the_schema_after_its_roles_prefix() {
        assert_eq!(
            channel(Role::Consumer, "ordo_consumer"),
            "ordo_inbox_ordo_consumer"
        );
        assert_eq!(
            channel(Role::Producer, "ordo_producer"),
            "ordo_outbox_ordo_producer"
        );
    }

    #[test]
    fn a_long_schemas_channel_is_cut_and_hashed_to_63_bytes() {
        let long = "s".repeat(63);
        let other = format!("{}t", "s".repeat(62));
        for role in [Role::Consumer, Role::Producer] {
            let (a, b) = (channel(role, &long), channel(role, &other));
            assert_eq!(a.len(), IDENTIFIER_MAX, "{a}");
            assert_eq!(b.len(), IDENTIFIER_MAX, "{b}");
            assert_ne!(a, b, "two schemas that share a start");
            assert_eq!(a, channel(role, &long), "deterministic");
        }
        let fits = "s".repeat(IDENTIFIER_MAX - "ordo_outbox_".len());
        assert_eq!(
            channel(Role::Producer, &fits),
            format!("ordo_outbox_{fits}")
        );
        // FNV-1a's published test vectors.
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
