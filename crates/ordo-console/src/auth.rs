//! The operator token: read from a file only its owner may read, entered
//! once in the login form, compared in constant time; the session cookie
//! it sets is a digest of it (HttpOnly, SameSite=Strict), never the token
//! itself.

use std::path::{Path, PathBuf};

use axum::http::header;
use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "ordo_console";

/// How long the browser keeps the session cookie (its `Max-Age`): 12
/// hours, one working shift; the operator then enters the token again.
pub const SESSION_MAX_AGE_S: u64 = 12 * 60 * 60;

/// The operator token.
#[derive(Clone)]
pub struct Token {
    digest: [u8; 32],
    session: String,
}

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
        let mut session = Sha256::new();
        session.update(b"ordo console session\n");
        session.update(token.as_bytes());
        Some(Token {
            digest: digest(token.as_bytes()),
            session: hex::encode(session.finalize()),
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

    /// The `Set-Cookie` value of a session.
    pub fn set_cookie(&self) -> String {
        format!(
            "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={SESSION_MAX_AGE_S}",
            self.session
        )
    }

    /// Whether the request carries this token's session cookie.
    pub fn session_valid(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .any(|(name, value)| {
                name == COOKIE && bool::from(value.as_bytes().ct_eq(self.session.as_bytes()))
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
        assert!(!token.session_valid(&headers));
        let cookie = token.set_cookie();
        let pair = cookie.split(';').next().unwrap().to_owned();
        headers.insert(header::COOKIE, format!("a=b; {pair}").parse().unwrap());
        assert!(token.session_valid(&headers));
        let other = Token::new("other").unwrap();
        assert!(!other.session_valid(&headers));
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
