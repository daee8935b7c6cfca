//! Request signing of HTTP.md's Authentication section: the key file, the
//! signature of one request and its verification.
//!
//! A request carries `ordo-key-id`, `ordo-timestamp` and `ordo-signature:
//! v1=BASE64 [v1=BASE64 ...]`, each value an HMAC-SHA256 with one of the key
//! id's secrets over `KEY_ID "\n" TIMESTAMP "\n" METHOD "\n" PATH "\n"
//! hex(sha256(BODY))`.
//!
//! Invariant: this module knows no transport. It takes the headers, the
//! method, the path and the body as given and answers yes or no (with the
//! reason, for the log); it never sees a store and never decides a status.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
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
    /// A line is not `KEY_ID SECRET_HEX`.
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

/// The keys of a key file: every secret of every key id, in file order.
#[derive(Debug, Clone, Default)]
pub struct KeyRing {
    keys: BTreeMap<String, Vec<Secret>>,
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
            let (key_id, secret) = parse_line(line).map_err(|rule| KeyFileError::Line {
                path: path.to_owned(),
                line: index + 1,
                rule,
            })?;
            ring.keys.entry(key_id).or_default().push(secret);
        }
        if ring.keys.is_empty() {
            return Err(KeyFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(ring)
    }

    /// Every secret of `key_id`, in file order (several: rotation).
    pub fn secrets(&self, key_id: &str) -> Option<&[Secret]> {
        self.keys.get(key_id).map(Vec::as_slice)
    }

    /// Checks a request's signing headers against this ring at `now_s`
    /// (Unix seconds): a known key id, a timestamp within [`WINDOW_S`], and
    /// one `v1=` value that matches one of the key id's secrets, compared in
    /// constant time.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        method: &str,
        path: &str,
        body: &[u8],
        now_s: i64,
    ) -> Result<(), AuthError> {
        let signed = self.signed(headers, now_s)?;
        let message = message(signed.key_id, signed.timestamp, method, path, body);
        let matches = |signature: &[u8]| {
            signed.secrets.iter().any(|secret| {
                mac(secret.as_bytes(), &message)
                    .verify_slice(signature)
                    .is_ok()
            })
        };
        if signed.signatures.iter().any(|s| matches(s)) {
            Ok(())
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
        let secrets = self.secrets(key_id).ok_or(AuthError::UnknownKeyId)?;
        if timestamp_s.abs_diff(now_s) > WINDOW_S.unsigned_abs() {
            return Err(AuthError::OutsideWindow { timestamp_s, now_s });
        }
        Ok(Signed {
            key_id,
            timestamp,
            secrets,
            signatures: parse_signatures(values)?,
        })
    }
}

/// A request's signing headers, read and checked but for the signature.
struct Signed<'a> {
    key_id: &'a str,
    timestamp: &'a str,
    secrets: &'a [Secret],
    signatures: Vec<Vec<u8>>,
}

/// `KEY_ID SECRET_HEX`, separated by whitespace.
fn parse_line(line: &str) -> Result<(String, Secret), String> {
    let mut fields = line.split_whitespace();
    let (Some(key_id), Some(hex_secret), None) = (fields.next(), fields.next(), fields.next())
    else {
        return Err("expected `KEY_ID SECRET_HEX` (two fields)".into());
    };
    check_key_id(key_id)?;
    let bytes = hex::decode(hex_secret).map_err(|e| format!("the secret is not hex ({e})"))?;
    Ok((key_id.to_owned(), Secret::new(bytes)?))
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
