//! PostgreSQL errors as backend-neutral store errors: the SQLSTATE always in
//! the message, and the kind a caller acts on.

use ordo_core::{ErrorKind, StoreError};
use postgres::error::SqlState;

/// The backend-neutral kind of a PostgreSQL error.
pub fn kind_of(error: &postgres::Error) -> ErrorKind {
    let Some(code) = error.code() else {
        return if lost_connection(error) {
            ErrorKind::ConnectionLost
        } else {
            // A value that does not convert, and the like.
            ErrorKind::Other
        };
    };
    kind_of_state(code)
}

/// Whether the connection failed or closed underneath (no SQLSTATE).
fn lost_connection(error: &postgres::Error) -> bool {
    use std::error::Error as _;
    error.is_closed()
        || error
            .source()
            .is_some_and(|source| source.downcast_ref::<std::io::Error>().is_some())
}

/// The kind of a SQLSTATE.
pub fn kind_of_state(code: &SqlState) -> ErrorKind {
    let text = code.code();
    if [
        &SqlState::T_R_SERIALIZATION_FAILURE,
        &SqlState::T_R_DEADLOCK_DETECTED,
        &SqlState::LOCK_NOT_AVAILABLE,
    ]
    .contains(&code)
    {
        return ErrorKind::Busy;
    }
    if text.starts_with("08")
        || [
            &SqlState::ADMIN_SHUTDOWN,
            &SqlState::CRASH_SHUTDOWN,
            &SqlState::CANNOT_CONNECT_NOW,
            &SqlState::TOO_MANY_CONNECTIONS,
            &SqlState::INVALID_CATALOG_NAME,
        ]
        .contains(&code)
    {
        return ErrorKind::ConnectionLost;
    }
    match code {
        c if c == &SqlState::READ_ONLY_SQL_TRANSACTION => ErrorKind::ReadOnly,
        c if c == &SqlState::DISK_FULL => ErrorKind::DiskFull,
        c if c == &SqlState::DATA_CORRUPTED || c == &SqlState::INDEX_CORRUPTED => {
            ErrorKind::Corrupt
        }
        _ => ErrorKind::Other,
    }
}

/// A PostgreSQL error with what was being done: the message names the
/// SQLSTATE (or says that the connection failed), and the kind is the one
/// callers act on.
pub fn pg_error(context: &str, error: postgres::Error) -> StoreError {
    let kind = kind_of(&error);
    if let Some(db) = error.as_db_error() {
        let mut message = format!(
            "{context}: {}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            message.push_str(&format!("; {detail}"));
        }
        return StoreError::with_source(kind, message, error);
    }
    let message = match error.code() {
        Some(code) => format!("{context} (SQLSTATE {})", code.code()),
        None if lost_connection(&error) => match std::error::Error::source(&error) {
            Some(cause) => format!("{context} (connection error: {cause})"),
            None => format!("{context} (connection error)"),
        },
        None => context.to_string(),
    };
    StoreError::with_source(kind, message, error)
}

/// Whether `error` is the server's refusal of a row whose key a unique
/// index already holds (SQLSTATE 23505).
pub(crate) fn is_unique_violation(error: &StoreError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<postgres::Error>())
        .and_then(postgres::Error::code)
        .is_some_and(|code| code == &SqlState::UNIQUE_VIOLATION)
}

/// An error at COMMIT: a refusal by the server (an `ERROR`: a
/// serialization failure, a deferred constraint) means nothing was
/// committed; anything else (the connection lost, or ended by the server
/// with a `FATAL` such as `57P01` while the COMMIT may already have been
/// recorded) leaves the outcome unknown.
pub fn commit_error(context: &str, error: postgres::Error) -> StoreError {
    let refused = error
        .as_db_error()
        .is_some_and(|db| db.severity() == "ERROR");
    if refused {
        return pg_error(context, error);
    }
    let cause = match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => "the connection failed".to_string(),
    };
    StoreError::with_source(
        ErrorKind::CommitOutcomeUnknown,
        format!("{context}: {cause} during COMMIT; whether it took effect is unknown"),
        error,
    )
}

/// A stored value that breaks the protocol's rules: the tables were changed
/// outside ordo.
pub(crate) fn corrupt(context: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(context, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_kinds() {
        let cases = [
            ("40001", ErrorKind::Busy),
            ("40P01", ErrorKind::Busy),
            ("55P03", ErrorKind::Busy),
            ("08006", ErrorKind::ConnectionLost),
            ("57P01", ErrorKind::ConnectionLost),
            ("25006", ErrorKind::ReadOnly),
            ("53100", ErrorKind::DiskFull),
            ("XX001", ErrorKind::Corrupt),
            ("23505", ErrorKind::Other),
        ];
        for (code, kind) in cases {
            assert_eq!(kind_of_state(&SqlState::from_code(code)), kind, "{code}");
        }
    }
}
