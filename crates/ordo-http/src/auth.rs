//! Request signing of HTTP.md's Authentication section: the key file, the
//! signature of one request and its verification.
//!
//! A request carries `ordo-key-id`, `ordo-timestamp` and `ordo-signature:
//! v1=BASE64 [v1=BASE64 ...]`, each value an HMAC-SHA256 with one of the key
//! id's secrets over `KEY_ID "\n" TIMESTAMP "\n" METHOD "\n" PATH "\n"
//! hex(sha256(BODY))`.
//!
//! A key file's line is `KEY_ID SECRET_HEX [producer=NAME]`: a key id may
//! be bound to one producer, which every line of it names (or none does).
//! The server and the relay read key files with the same [`KeyRing::load`].
//!
//! Invariant: this module knows no transport. It takes the headers, the
//! method, the path and the body as given and answers yes or no (with the
//! reason, for the log); it never sees a store and never decides a status.

use std::collections::btree_map::{BTreeMap, Entry};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use ordo_core::ProducerName;
use sha2::{Digest, Sha256};

/// The header naming the key.
pub const HEADER_KEY_ID: &str = "ordo-key-id";
/// The header carrying the request's time, in Unix seconds.
pub const HEADER_TIMESTAMP: &str = "ordo-timestamp";
/// The header carrying the signatures (`v1=BASE64`, space-separated).
pub const HEADER_SIGNATURE: &str = "ordo-signature";
/// How far a request's timestamp may be from the server's clock, in seconds.
pub const WINDOW_S: i64 = 300;
/// The shortest secret, in bytes.
pub const SECRET_LEN_MIN: usize = 32;
/// The longest secret, in bytes.
pub const SECRET_LEN_MAX: usize = 1024;
/// The longest key id, in bytes.
pub const KEY_ID_LEN_MAX: usize = 128;
/// The largest key file read, in bytes.
pub const KEY_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// The most `v1=` values of one request that are checked.
pub const SIGNATURES_MAX: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// One secret of a key id. Its bytes never show in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret from its bytes (at least [`SECRET_LEN_MIN`]).
    pub fn new(bytes: Vec<u8>) -> Result<Secret, String> {
        if bytes.len() < SECRET_LEN_MIN || bytes.len() > SECRET_LEN_MAX {
            return Err(format!(
                "a secret must be {SECRET_LEN_MIN} to {SECRET_LEN_MAX} bytes (got {})",
                bytes.len()
            ));
        }
        Ok(Secret(bytes))
    }

    /// The HMAC key.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// Why a key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file cannot be read.
    #[error("cannot read key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The reason.
        source: std::io::Error,
    },
    /// Group or others may read the file.
    #[error("key file {path} is readable by group or others (mode {mode:04o}); restrict it, for example with chmod 600")]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is larger than [`KEY_FILE_BYTES_MAX`].
    #[error("key file {path} is larger than {KEY_FILE_BYTES_MAX} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// A line is not `KEY_ID SECRET_HEX [producer=NAME]`, or binds its key
    /// id otherwise than an earlier line of it.
    #[error("key file {path} line {line}: {rule}")]
    Line {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        rule: String,
    },
    /// No key at all.
    #[error("key file {path} holds no key (lines `KEY_ID SECRET_HEX`)")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Why a request's signature was refused (answered 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// A signing header is absent.
    #[error("header {0} is missing")]
    Missing(&'static str),
    /// A signing header is not of its form.
    #[error("header {header} is malformed: {rule}")]
    Malformed {
        /// The header.
        header: &'static str,
        /// Its form.
        rule: &'static str,
    },
    /// The key id is not in the key file.
    #[error("unknown key id")]
    UnknownKeyId,
    /// The timestamp is outside the window.
    #[error("timestamp {timestamp_s} is more than {WINDOW_S} s from the server's clock ({now_s})")]
    OutsideWindow {
        /// The request's time.
        timestamp_s: i64,
        /// The server's time.
        now_s: i64,
    },
    /// No signature matches any secret of the key id.
    #[error("no signature matches")]
    NoMatch,
}

/// The keys of a key file: every key id with its secrets, in file order,
/// and the producer it is bound to, if any.
#[derive(Debug, Clone, Default)]
pub struct KeyRing {
    keys: BTreeMap<String, Key>,
}

/// One key id of a key file.
#[derive(Debug, Clone)]
struct Key {
    /// Every secret of it, in file order (several: rotation).
    secrets: Vec<Secret>,
    /// The producer every line of it names; `None` when none does.
    producer: Option<ProducerName>,
    /// The first line naming it, from 1.
    line: usize,
}

/// The key a request was signed with, as [`KeyRing::verify`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Its key id.
    pub key_id: String,
    /// The producer it is bound to; `None` for a key that may deliver for
    /// every producer.
    pub producer: Option<ProducerName>,
}

impl KeyRing {
    /// Reads a key file, refusing one that group or others may read.
    pub fn load(path: &Path) -> Result<KeyRing, KeyFileError> {
        let io = |source| KeyFileError::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        check_mode(path, &file.metadata().map_err(io)?)?;
        let mut text = String::new();
        file.take(KEY_FILE_BYTES_MAX + 1)
            .read_to_string(&mut text)
            .map_err(io)?;
        if text.len() as u64 > KEY_FILE_BYTES_MAX {
            return Err(KeyFileError::TooLarge {
                path: path.to_owned(),
            });
        }
        KeyRing::parse(&text, path)
    }

    /// Parses the text of a key file (`path` only names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<KeyRing, KeyFileError> {
        let mut ring = KeyRing::default();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            parse_line(line)
                .and_then(|parsed| ring.add(parsed, index + 1))
                .map_err(|rule| KeyFileError::Line {
                    path: path.to_owned(),
                    line: index + 1,
                    rule,
                })?;
        }
        if ring.keys.is_empty() {
            return Err(KeyFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(ring)
    }

    /// Adds line `number`, refusing one that binds its key id otherwise
    /// than the key id's earlier lines.
    fn add(&mut self, parsed: Line, number: usize) -> Result<(), String> {
        match self.keys.entry(parsed.key_id) {
            Entry::Vacant(vacant) => {
                vacant.insert(Key {
                    secrets: vec![parsed.secret],
                    producer: parsed.producer,
                    line: number,
                });
            }
            Entry::Occupied(mut occupied) => {
                let key = occupied.get();
                if key.producer != parsed.producer {
                    return Err(format!(
                        "key id {} is bound to {} here but to {} on line {}; every line of one key id names the same producer (producer=NAME) or none",
                        occupied.key(),
                        bound_to(parsed.producer.as_ref()),
                        bound_to(key.producer.as_ref()),
                        key.line
                    ));
                }
                occupied.get_mut().secrets.push(parsed.secret);
            }
        }
        Ok(())
    }

    /// Every secret of `key_id`, in file order (several: rotation).
    pub fn secrets(&self, key_id: &str) -> Option<&[Secret]> {
        self.keys.get(key_id).map(|key| key.secrets.as_slice())
    }

    /// The producer `key_id` is bound to; `None` for a key id bound to
    /// none, or not in the ring.
    pub fn producer(&self, key_id: &str) -> Option<&ProducerName> {
        self.keys.get(key_id)?.producer.as_ref()
    }

    /// The key ids bound to no producer, in order.
    pub fn unbound(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter(|(_, key)| key.producer.is_none())
            .map(|(key_id, _)| key_id.as_str())
    }

    /// Checks a request's signing headers against this ring at `now_s`
    /// (Unix seconds): a known key id, a timestamp within [`WINDOW_S`], and
    /// one `v1=` value that matches one of the key id's secrets, compared in
    /// constant time. Answers the key that signed it.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        method: &str,
        path: &str,
        body: &[u8],
        now_s: i64,
    ) -> Result<Verified, AuthError> {
        let signed = self.signed(headers, now_s)?;
        let message = message(signed.key_id, signed.timestamp, method, path, body);
        let matches = |signature: &[u8]| {
            signed.key.secrets.iter().any(|secret| {
                mac(secret.as_bytes(), &message)
                    .verify_slice(signature)
                    .is_ok()
            })
        };
        if signed.signatures.iter().any(|s| matches(s)) {
            Ok(Verified {
                key_id: signed.key_id.to_owned(),
                producer: signed.key.producer.clone(),
            })
        } else {
            Err(AuthError::NoMatch)
        }
    }

    /// The checks of [`KeyRing::verify`] that need no body: the three
    /// headers present and well-formed, the key id known, the timestamp
    /// within the window. The signature itself is not checked.
    pub fn check_headers(&self, headers: &HeaderMap, now_s: i64) -> Result<(), AuthError> {
        self.signed(headers, now_s).map(|_| ())
    }

    fn signed<'a>(&'a self, headers: &'a HeaderMap, now_s: i64) -> Result<Signed<'a>, AuthError> {
        let key_id = header(headers, HEADER_KEY_ID)?;
        let timestamp = header(headers, HEADER_TIMESTAMP)?;
        let values = header(headers, HEADER_SIGNATURE)?;
        let timestamp_s = parse_timestamp(timestamp)?;
        let key = self.keys.get(key_id).ok_or(AuthError::UnknownKeyId)?;
        if timestamp_s.abs_diff(now_s) > WINDOW_S.unsigned_abs() {
            return Err(AuthError::OutsideWindow { timestamp_s, now_s });
        }
        Ok(Signed {
            key_id,
            timestamp,
            key,
            signatures: parse_signatures(values)?,
        })
    }
}

/// `producer NAME` or `no producer`, for a refusal.
fn bound_to(producer: Option<&ProducerName>) -> String {
    match producer {
        Some(name) => format!("producer {name}"),
        None => "no producer".to_owned(),
    }
}

/// A request's signing headers, read and checked but for the signature.
struct Signed<'a> {
    key_id: &'a str,
    timestamp: &'a str,
    key: &'a Key,
    signatures: Vec<Vec<u8>>,
}

/// The form of a key file's line, for its refusals.
const LINE_FORM: &str = "expected `KEY_ID SECRET_HEX [producer=NAME]`";

/// One line of a key file.
struct Line {
    key_id: String,
    secret: Secret,
    producer: Option<ProducerName>,
}

/// `KEY_ID SECRET_HEX [producer=NAME]`, separated by whitespace. A refusal
/// never repeats a field after the key id, which may be a secret.
fn parse_line(line: &str) -> Result<Line, String> {
    let mut fields = line.split_whitespace();
    let (Some(key_id), Some(hex_secret)) = (fields.next(), fields.next()) else {
        return Err(format!("{LINE_FORM} (two or three fields)"));
    };
    check_key_id(key_id)?;
    let bytes = hex::decode(hex_secret).map_err(|e| format!("the secret is not hex ({e})"))?;
    let secret = Secret::new(bytes)?;
    let producer = match (fields.next(), fields.next()) {
        (None, _) => None,
        (Some(field), None) => Some(parse_producer(field)?),
        (Some(_), Some(_)) => return Err(format!("{LINE_FORM} (more than three fields)")),
    };
    Ok(Line {
        key_id: key_id.to_owned(),
        secret,
        producer,
    })
}

/// The third field: `producer=NAME`, NAME a producer name.
fn parse_producer(field: &str) -> Result<ProducerName, String> {
    let Some(name) = field.strip_prefix("producer=") else {
        return Err(format!(
            "{LINE_FORM}: the field after the secret is not producer=NAME"
        ));
    };
    ProducerName::new(name).map_err(|e| format!("producer=NAME: {e}"))
}

/// A key id: 1 to [`KEY_ID_LEN_MAX`] visible ASCII characters.
fn check_key_id(key_id: &str) -> Result<(), String> {
    let visible = key_id.bytes().all(|b| b.is_ascii_graphic());
    if key_id.is_empty() || key_id.len() > KEY_ID_LEN_MAX || !visible {
        return Err(format!(
            "a key id must be 1 to {KEY_ID_LEN_MAX} visible ASCII characters"
        ));
    }
    Ok(())
}

/// Refuses a secret file (a key file, a TLS private key) that group or
/// others may read.
pub fn check_private(path: &Path) -> Result<(), KeyFileError> {
    let metadata = std::fs::metadata(path).map_err(|source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    })?;
    check_mode(path, &metadata)
}

#[cfg(unix)]
fn check_mode(path: &Path, metadata: &std::fs::Metadata) -> Result<(), KeyFileError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_mode(_path: &Path, _metadata: &std::fs::Metadata) -> Result<(), KeyFileError> {
    Ok(())
}

fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, AuthError> {
    let value = headers.get(name).ok_or(AuthError::Missing(name))?;
    value.to_str().map_err(|_| AuthError::Malformed {
        header: name,
        rule: "must be visible ASCII",
    })
}

fn parse_timestamp(text: &str) -> Result<i64, AuthError> {
    let malformed = AuthError::Malformed {
        header: HEADER_TIMESTAMP,
        rule: "must be Unix seconds as a decimal integer",
    };
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed);
    }
    text.parse().map_err(|_| malformed)
}

/// The decoded `v1=` values (other versions are skipped); at most
/// [`SIGNATURES_MAX`] are looked at.
fn parse_signatures(text: &str) -> Result<Vec<Vec<u8>>, AuthError> {
    let malformed = |rule| AuthError::Malformed {
        header: HEADER_SIGNATURE,
        rule,
    };
    let mut signatures = Vec::new();
    for token in text
        .split(' ')
        .filter(|t| !t.is_empty())
        .take(SIGNATURES_MAX)
    {
        if let Some(encoded) = token.strip_prefix("v1=") {
            let decoded = BASE64
                .decode(encoded)
                .map_err(|_| malformed("a v1= value must be standard base64 with padding"))?;
            signatures.push(decoded);
        }
    }
    if signatures.is_empty() {
        return Err(malformed("must hold a v1= value"));
    }
    Ok(signatures)
}

/// The signed text of a request.
fn message(key_id: &str, timestamp: &str, method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let body_hash = hex::encode(Sha256::digest(body));
    format!("{key_id}\n{timestamp}\n{method}\n{path}\n{body_hash}").into_bytes()
}

fn mac(secret: &[u8], message: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(message);
    mac
}

/// The `v1=BASE64` signature of one request with one secret.
pub fn sign(
    key_id: &str,
    secret: &[u8],
    timestamp_s: i64,
    method: &str,
    path: &str,
    body: &[u8],
) -> String {
    let message = message(key_id, &timestamp_s.to_string(), method, path, body);
    let tag = mac(secret, &message).finalize().into_bytes();
    format!("v1={}", BASE64.encode(tag))
}

/// The three signing headers of a request, as (name, value) pairs, signed
/// with every secret `ring` lists for `key_id` (space-separated `v1=`
/// values), or `None` for a key id the ring does not hold. `path` is the
/// request's path without the query string.
pub fn signature_headers(
    ring: &KeyRing,
    key_id: &str,
    timestamp_s: i64,
    method: &str,
    path: &str,
    body: &[u8],
) -> Option<[(&'static str, String); 3]> {
    let secrets = ring.secrets(key_id)?;
    let signatures: Vec<String> = secrets
        .iter()
        .map(|secret| sign(key_id, secret.as_bytes(), timestamp_s, method, path, body))
        .collect();
    Some([
        (HEADER_KEY_ID, key_id.to_owned()),
        (HEADER_TIMESTAMP, timestamp_s.to_string()),
        (HEADER_SIGNATURE, signatures.join(" ")),
    ])
}

#[cfg(test)]
mod tests;
