//! The operator token: read from a file only its owner may read, entered
//! once in the login form, compared in constant time. The session cookie
//! it sets (HttpOnly, SameSite=Strict) is never the token itself: it is the
//! time of the login and an HMAC of that time under a key derived from the
//! token, so that the console refuses it after [`SESSION_MAX_AGE_S`] even
//! if a browser kept it.

use std::path::{Path, PathBuf};

use axum::http::header;
use axum::http::HeaderMap;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "ordo_console";

/// How long a session lasts: 12 hours, one working shift; the operator
/// then enters the token again. The cookie's `Max-Age`, and the most the
/// console accepts between a login and a request.
pub const SESSION_MAX_AGE_S: u64 = 12 * 60 * 60;

/// The operator token.
#[derive(Clone)]
pub struct Token {
    digest: [u8; 32],
    session_key: [u8; 32],
}

type HmacSha256 = Hmac<Sha256>;

/// Why a token file was refused.
#[derive(Debug)]
pub enum TokenError {
    /// The file cannot be read.
    Io(PathBuf, std::io::Error),
    /// The file holds no token.
    Empty(PathBuf),
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenError::Io(path, e) => {
                write!(f, "cannot read the token file {}: {e}", path.display())
            }
            TokenError::Empty(path) => {
                write!(f, "the token file {} holds no token", path.display())
            }
        }
    }
}

impl std::error::Error for TokenError {}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Token {
    /// The token of `text`, surrounding whitespace trimmed; `None` when
    /// nothing is left.
    pub fn new(text: &str) -> Option<Token> {
        let token = text.trim();
        if token.is_empty() {
            return None;
        }
        let mut session_key = Sha256::new();
        session_key.update(b"ordo console session\n");
        session_key.update(token.as_bytes());
        Some(Token {
            digest: digest(token.as_bytes()),
            session_key: session_key.finalize().into(),
        })
    }

    /// Reads the token file (its first line). The caller checks that only
    /// its owner may read it.
    pub fn load(path: &Path) -> Result<Token, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|e| TokenError::Io(path.to_owned(), e))?;
        let first = text.lines().next().unwrap_or("");
        Token::new(first).ok_or_else(|| TokenError::Empty(path.to_owned()))
    }

    /// Whether `candidate` is the token, in time independent of where they
    /// differ (both sides are hashed to one length first).
    pub fn matches(&self, candidate: &str) -> bool {
        bool::from(digest(candidate.as_bytes()).ct_eq(&self.digest))
    }

    fn mac(&self, login_ms: i64) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.session_key).expect("HMAC takes a key of any length");
        mac.update(login_ms.to_string().as_bytes());
        mac
    }

    /// The `Set-Cookie` value of a session opened at `now_ms`:
    /// `LOGIN_MS.HMAC`.
    pub fn set_cookie(&self, now_ms: i64) -> String {
        let mac = hex::encode(self.mac(now_ms).finalize().into_bytes());
        format!(
            "{COOKIE}={now_ms}.{mac}; HttpOnly; SameSite=Strict; Path=/; Max-Age={SESSION_MAX_AGE_S}"
        )
    }

    /// Whether the request carries a session cookie of this token opened
    /// less than [`SESSION_MAX_AGE_S`] before `now_ms` (and not after it).
    pub fn session_valid(&self, headers: &HeaderMap, now_ms: i64) -> bool {
        let max_age_ms = i64::try_from(SESSION_MAX_AGE_S * 1000).unwrap_or(i64::MAX);
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .filter(|(name, _)| *name == COOKIE)
            .filter_map(|(_, value)| value.split_once('.'))
            .any(|(login, mac)| {
                let (Ok(login_ms), Ok(mac)) = (login.parse::<i64>(), hex::decode(mac)) else {
                    return false;
                };
                login_ms <= now_ms
                    && now_ms.saturating_sub(login_ms) < max_age_ms
                    && self.mac(login_ms).verify_slice(&mac).is_ok()
            })
    }
}

/// The token every action form carries and every POST of an action must
/// return: random per process, compared in constant time.
#[derive(Clone)]
pub struct Csrf(String);

impl Csrf {
    /// A fresh token from the system's random source.
    pub fn generate() -> Result<Csrf, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes)?;
        Ok(Csrf(hex::encode(bytes)))
    }

    /// The token, for a form's hidden field.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `candidate` is the token.
    pub fn matches(&self, candidate: &str) -> bool {
        bool::from(digest(candidate.as_bytes()).ct_eq(&digest(self.0.as_bytes())))
    }
}

/// Whether a POST comes from the console's own pages: no `Origin` header
/// (a client that is not a browser) or one naming the request's `Host`.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let (Ok(origin), Some(Ok(host))) = (
        origin.to_str(),
        headers.get(header::HOST).map(|h| h.to_str()),
    ) else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority == Some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_and_session() {
        let token = Token::new(" secret\n").unwrap();
        assert!(token.matches("secret"));
        assert!(!token.matches("secreT"));
        assert!(!token.matches(""));
        assert!(Token::new("  ").is_none());
        let mut headers = HeaderMap::new();
        let login = 1_700_000_000_000;
        assert!(!token.session_valid(&headers, login));
        let cookie = token.set_cookie(login);
        let pair = cookie.split(';').next().unwrap().to_owned();
        headers.insert(header::COOKIE, format!("a=b; {pair}").parse().unwrap());
        assert!(token.session_valid(&headers, login));
        let last = login + i64::try_from(SESSION_MAX_AGE_S * 1000).unwrap() - 1;
        assert!(token.session_valid(&headers, last));
        assert!(!token.session_valid(&headers, last + 1), "expired");
        assert!(!token.session_valid(&headers, login - 1), "from the future");
        let other = Token::new("other").unwrap();
        assert!(!other.session_valid(&headers, login));
        // Another login time under the same MAC is refused.
        let mac = pair.split_once('.').unwrap().1;
        headers.insert(
            header::COOKIE,
            format!("{COOKIE}={}.{mac}", login + 1).parse().unwrap(),
        );
        assert!(!token.session_valid(&headers, login + 1));
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        assert!(cookie.ends_with(&format!("; Max-Age={SESSION_MAX_AGE_S}")));
    }

    #[test]
    fn origins() {
        let mut headers = HeaderMap::new();
        assert!(same_origin(&headers));
        headers.insert(header::HOST, "127.0.0.1:7080".parse().unwrap());
        headers.insert(header::ORIGIN, "http://127.0.0.1:7080".parse().unwrap());
        assert!(same_origin(&headers));
        headers.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&headers));
    }
}
