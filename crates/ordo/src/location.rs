//! Where a store lives: an SQLite file or a PostgreSQL database.
//!
//! Invariant: a location is a PostgreSQL URL only when it starts with
//! `postgres://` or `postgresql://`; anything else is a file path, taken as
//! it is. A URL is only ever shown with its password replaced by `***`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where a store lives: an SQLite file, or a PostgreSQL database.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite file.
    File(PathBuf),
    /// A PostgreSQL connection URL, as given (it may hold a password:
    /// show it only through [`Location`]'s `Display`).
    Postgres(String),
}

impl From<OsString> for Location {
    fn from(value: OsString) -> Location {
        match value.to_str() {
            Some(text) if ordo_postgres::is_postgres_url(text) => {
                Location::Postgres(text.to_owned())
            }
            _ => Location::File(PathBuf::from(value)),
        }
    }
}

impl From<&str> for Location {
    fn from(value: &str) -> Location {
        Location::from(OsString::from(value))
    }
}

impl Location {
    /// The file, for an SQLite store.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Location::File(path) => Some(path),
            Location::Postgres(_) => None,
        }
    }
}

impl fmt::Debug for Location {
    /// As `Display`: never the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File(path) => f.debug_tuple("File").field(path).finish(),
            Location::Postgres(url) => f.debug_tuple("Postgres").field(&redact(url)).finish(),
        }
    }
}

impl fmt::Display for Location {
    /// The path, or the URL with its password shown as `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File(path) => write!(f, "{}", path.display()),
            Location::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

/// A PostgreSQL URL with its password shown as `***`.
pub use ordo_postgres::redact_url as redact;

/// Any text is a location (a path, or a URL); never an error.
impl FromStr for Location {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Location, Self::Err> {
        Ok(Location::from(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_two_schemes_are_urls() {
        let cases = [
            ("postgres://u@h/db", true),
            ("postgresql://u@h/db", true),
            ("file:x.db", false),
            ("postgres:/x", false),
            ("Postgres://u@h/db", false),
            ("./postgres://x", false),
            ("x.db", false),
        ];
        for (value, url) in cases {
            let location = Location::from(value);
            assert_eq!(matches!(location, Location::Postgres(_)), url, "{value}");
        }
    }

    #[test]
    fn passwords_are_hidden() {
        let cases = [
            (
                "postgres://me:secret@127.0.0.1:5432/db",
                "postgres://me:***@127.0.0.1:5432/db",
            ),
            ("postgres://me@h/db", "postgres://me@h/db"),
            ("postgres://h/db", "postgres://h/db"),
            (
                "postgresql://me:s:e@c@h:1/db?sslmode=disable&password=x",
                "postgresql://me:***@h:1/db?sslmode=disable&password=***",
            ),
            (
                "postgres://me:secret@h:notaport",
                "postgres://me:***@h:notaport",
            ),
            ("postgres://me:se/c?r@et@h/db", "postgres://me:***@h/db"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact(url), shown, "{url}");
            assert_eq!(Location::from(url).to_string(), shown, "{url}");
        }
    }
}
