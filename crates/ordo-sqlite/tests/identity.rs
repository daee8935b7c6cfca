//! Every store has an identity (PROTOCOL.md section 12): 32 lowercase
//! hexadecimal digits given when the store is created, its own, kept
//! across opens; a store of the second release is given one at its first
//! open by this release, and keeps it after.

use std::path::Path;

use ordo_core::{ConsumerOps, ProducerOps, StoreId};
use ordo_sqlite::{ConsumerDb, ProducerDb, Schema, SCHEMA_VERSION};
use rusqlite::Connection;

fn schema() -> Schema {
    Schema::new("identity").unwrap()
}

/// Opens (or creates) the producer store (`producer`) or the consumer
/// store at `path`, and returns its identity.
fn open(producer: bool, path: &Path) -> StoreId {
    if producer {
        ProducerDb::open(path, &schema())
            .unwrap()
            .store_id()
            .clone()
    } else {
        ConsumerDb::open(path, &schema())
            .unwrap()
            .store_id()
            .clone()
    }
}

fn stored_id(path: &Path) -> Option<String> {
    Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT value FROM ordo_meta WHERE key = 'store_id'",
            [],
            |row| row.get(0),
        )
        .ok()
}

#[test]
fn every_store_has_an_identity_of_its_own_kept_across_opens() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name);
    let producer = open(true, &at("p.db"));
    assert_eq!(open(true, &at("p.db")), producer, "reopened");
    assert_eq!(stored_id(&at("p.db")).as_deref(), Some(producer.as_str()));
    let consumer = open(false, &at("c.db"));
    assert_eq!(open(false, &at("c.db")), consumer, "reopened");
    let second_producer = open(true, &at("p2.db"));
    assert_ne!(producer, consumer);
    assert_ne!(producer, second_producer);
}

/// A producer file's tables brought back to the second release's: custody
/// in the outbox and its heads, no destinations.
const SECOND_RELEASE_OUTBOX: &str = "
DROP TABLE custody; DROP TABLE relay_head; DROP TABLE destination;
DROP TRIGGER producer_repair_append_only_update; DROP TRIGGER producer_repair_append_only_delete;
DROP TABLE producer_repair;
DROP TABLE outbox;
CREATE TABLE outbox (
    position INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, flow_id TEXT NOT NULL,
    seq INTEGER NOT NULL, schema_version INTEGER NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL, accepted INTEGER NOT NULL DEFAULT 0, accepted_at_ms INTEGER,
    quarantined INTEGER NOT NULL DEFAULT 0, quarantine_reason TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, last_outcome TEXT, last_error TEXT,
    next_attempt_at_ms INTEGER NOT NULL DEFAULT 0, UNIQUE (flow_id, seq));
DROP TABLE outbox_head;
CREATE TABLE outbox_head (
    flow_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL, relay_seq INTEGER,
    relay_due_ms INTEGER NOT NULL DEFAULT 0, relay_turn INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
";

/// A consumer file's tables brought back to the second release's: one
/// namespace, rows without their delivering store.
const SECOND_RELEASE_INBOX: &str = "
DROP TABLE inbox; DROP TABLE inbox_cursor; DROP TABLE inbox_fingerprint; DROP TABLE inbox_watermark;
DROP TRIGGER repair_log_append_only_update; DROP TRIGGER repair_log_append_only_delete;
DROP TABLE repair_log;
CREATE TABLE inbox (
    event_id TEXT PRIMARY KEY, flow_id TEXT NOT NULL, seq INTEGER NOT NULL,
    schema_version INTEGER NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    body_hash TEXT NOT NULL, status TEXT NOT NULL, reason TEXT, detail TEXT,
    received_at_ms INTEGER NOT NULL, settled_at_ms INTEGER, UNIQUE (flow_id, seq)) WITHOUT ROWID;
CREATE TABLE inbox_cursor (flow_id TEXT PRIMARY KEY, applied_seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE inbox_fingerprint (
    flow_id TEXT NOT NULL, seq INTEGER NOT NULL, event_id TEXT NOT NULL UNIQUE,
    body_hash BLOB NOT NULL, status TEXT NOT NULL, PRIMARY KEY (flow_id, seq)) WITHOUT ROWID;
CREATE TABLE inbox_watermark (flow_id TEXT PRIMARY KEY, pruned_seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE repair_log (
    id INTEGER PRIMARY KEY, action TEXT NOT NULL, flow_id TEXT NOT NULL, seq INTEGER NOT NULL,
    event_id TEXT NOT NULL, reason TEXT NOT NULL, decided_by TEXT NOT NULL, at_ms INTEGER NOT NULL);
";

#[test]
fn a_second_release_store_is_given_an_identity_at_its_first_open() {
    let dir = tempfile::tempdir().unwrap();
    for producer in [true, false] {
        let path = dir.path().join(if producer { "p.db" } else { "c.db" });
        let created = open(producer, &path);
        // The second release's file: its tables at version 2 (custody in
        // the outbox, no relay stops, a consumer's rows without their
        // delivering store), no identity.
        let rows_without_sender = match producer {
            true => SECOND_RELEASE_OUTBOX,
            false => SECOND_RELEASE_INBOX,
        };
        Connection::open(&path)
            .unwrap()
            .execute_batch(&format!(
                "DELETE FROM ordo_meta WHERE key = 'store_id'; PRAGMA user_version = 2;
                 {rows_without_sender}"
            ))
            .unwrap();
        assert_eq!(stored_id(&path), None);
        let given = open(producer, &path);
        assert_ne!(given, created, "a new identity, not a remembered one");
        assert_eq!(stored_id(&path).as_deref(), Some(given.as_str()));
        assert_eq!(open(producer, &path), given, "kept after");
        let version: i64 = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }
}

#[test]
fn a_damaged_identity_is_refused_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    open(true, &path);
    Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE ordo_meta SET value = 'not-an-id' WHERE key = 'store_id'",
            [],
        )
        .unwrap();
    let err = ProducerDb::open(&path, &schema()).err().expect("refused");
    assert_eq!(err.kind(), ordo_core::ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("\"not-an-id\""), "{err}");
}
