//! How the runtime's loops watch an SQLite file: this process's commits
//! raise the file's signal (by its canonical path), and another process's
//! commits move the file's `data_version`, which a loop reads cheaply on
//! its own connection while it idles.

use std::path::Path;

use ordo_core::{Signal, StoreError};
use rusqlite::Connection;

use crate::conn::sql_error;

/// The wake-up signal of the file at `path` in this process (by its
/// canonical path when it exists, so two handles on one file share it).
pub(crate) fn signal_for(path: &Path) -> Signal {
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Signal::for_key(format!("sqlite:{}", key.display()))
}

/// The last `data_version` a handle saw: SQLite moves it on this
/// connection when another connection commits to the file, never for this
/// connection's own commits.
#[derive(Debug, Default)]
pub(crate) struct DataVersion(Option<i64>);

impl DataVersion {
    /// Whether another connection committed since the last look (the first
    /// look says yes: nothing was seen before it).
    pub(crate) fn changed(&mut self, conn: &Connection) -> Result<bool, StoreError> {
        let now: i64 = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
            .map_err(|e| sql_error("cannot read the file's data version", e))?;
        let changed = self.0 != Some(now);
        self.0 = Some(now);
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_connections_commit_moves_the_version_and_ones_own_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let mine = Connection::open(&path).unwrap();
        let other = Connection::open(&path).unwrap();
        mine.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x)")
            .unwrap();
        let mut seen = DataVersion::default();
        assert!(seen.changed(&mine).unwrap(), "the first look");
        assert!(!seen.changed(&mine).unwrap(), "nothing since");
        mine.execute("INSERT INTO t VALUES (1)", []).unwrap();
        assert!(!seen.changed(&mine).unwrap(), "its own commit");
        other.execute("INSERT INTO t VALUES (2)", []).unwrap();
        assert!(seen.changed(&mine).unwrap(), "another connection's commit");
        assert!(!seen.changed(&mine).unwrap());
    }

    #[test]
    fn two_paths_to_one_file_share_a_signal() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.db");
        std::fs::write(&file, b"").unwrap();
        let a = signal_for(&file);
        let b = signal_for(&dir.path().join(".").join("p.db"));
        let seen = b.generation();
        a.raise();
        assert_eq!(b.generation(), seen + 1);
    }
}
