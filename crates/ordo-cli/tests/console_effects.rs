//! The console's effect intents page on a real `ordo console` process over
//! a real SQLite file whose intents an application's handler recorded:
//! counts by state, the list, and the audited actions, each previewed,
//! confirmed once, refused with nothing written where the state, the form
//! or the origin does not allow it.

mod common;

use common::console::Console;
use common::http::{hidden, post, Page};
use ordo_core::{process_all, ApplyContext, ConsumerOps, Envelope, Receive, StoreError, Verdict};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, Schema};
use serde_json::json;

/// A consumer file of the domain `shop` holding one pending `notify` intent
/// per flow of `flows`; its path and the intents' keys.
fn shop(dir: &tempfile::TempDir, flows: &[&str]) -> (String, Vec<String>) {
    let path = dir.path().join("shop.db");
    let mut db = ConsumerDb::open(&path, &Schema::new("shop").unwrap()).unwrap();
    for flow in flows {
        let body = format!(
            r#"{{"event_id": "{flow}-1", "flow_id": "{flow}", "seq": 1,
                "schema_version": 1, "type": "placed", "payload": {{}}}}"#
        );
        db.receive(&Envelope::parse_str(&body).unwrap()).unwrap();
    }
    let mut notify =
        |cx: &mut ApplyContext<Connection>, e: &Envelope| -> Result<Verdict, StoreError> {
            cx.effect("notify", &json!({"flow": e.flow_id.as_str()}))?;
            Ok(Verdict::Apply)
        };
    process_all(&mut db, None, &mut notify, 256).unwrap();
    let keys = flows
        .iter()
        .map(|f| format!("{}/default/{f}/1/notify", db.store_id()))
        .collect();
    (path.to_str().unwrap().to_owned(), keys)
}

/// The effect actions of the repair log, with their keys.
fn logged(path: &str) -> Vec<(String, String)> {
    let conn = Connection::open(path).unwrap();
    let mut statement = conn
        .prepare("SELECT action, key FROM repair_log WHERE key IS NOT NULL ORDER BY id")
        .unwrap();
    let rows = statement
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

fn get(console: &Console, path: &str) -> Page {
    common::http::page(common::http::agent().get(&console.url(path)).call())
}

fn encoded(key: &str) -> String {
    key.replace('/', "%2F")
}

#[test]
fn intents_are_listed_by_state_and_acted_on_after_a_preview() {
    let dir = tempfile::tempdir().unwrap();
    let (path, keys) = shop(&dir, &["o-1", "o-2"]);
    let console = Console::start(&["--consumer", &path]);

    let list = get(&console, "/effects");
    list.assert_says(200, &keys[0]);
    assert!(list.text.contains(&keys[1]), "{}", list.text);
    assert!(
        list.text.contains("data-effect-state=\"pending\">2<"),
        "{}",
        list.text
    );
    let none = get(&console, "/effects?state=succeeded");
    none.assert_says(200, "No intent here.");
    get(&console, "/effects?state=done").assert_says(400, "effect state");

    let preview = get(
        &console,
        &format!("/effects/act?action=skip&key={}", encoded(&keys[0])),
    );
    preview.assert_says(200, "appended to the repair log");
    let csrf = hidden(&preview, "csrf").unwrap();
    let confirm = hidden(&preview, "confirm").unwrap();
    let form = |by: &str, reason: &str| {
        vec![
            ("key", keys[0].clone()),
            ("action", "skip".to_owned()),
            ("csrf", csrf.clone()),
            ("confirm", confirm.clone()),
            ("by", by.to_owned()),
            ("reason", reason.to_owned()),
        ]
    };
    let send = |origin: Option<&str>, fields: &[(&str, String)]| {
        let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post(&console, "/effects/act", origin, &pairs)
    };
    let own = console.url("");
    send(Some(&own), &form("ops", " ")).assert_says(400, "reason");
    send(Some("http://evil.example"), &form("ops", "why")).assert_says(403, "cross-origin");
    assert!(logged(&path).is_empty(), "nothing written");

    send(Some(&own), &form("ops", "the customer cancelled")).assert_says(200, "now skipped");
    assert_eq!(logged(&path), [("effect_skip".to_owned(), keys[0].clone())]);
    send(Some(&own), &form("ops", "again")).assert_says(409, "already used");

    // A skipped intent allows nothing: the preview says so and offers no form.
    let refused = get(
        &console,
        &format!("/effects/act?action=retry&key={}", encoded(&keys[0])),
    );
    refused.assert_says(200, "does not allow retry");
    assert!(hidden(&refused, "confirm").is_none());
    get(&console, "/effects/act?action=skip&key=nope").assert_says(400, "effect key");
    assert_eq!(console.terminate(), 0);
}

#[test]
fn a_read_only_console_shows_no_effect_action_and_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let (path, keys) = shop(&dir, &["o-1"]);
    let console = Console::start(&["--consumer", &path, "--read-only"]);
    let list = get(&console, "/effects");
    list.assert_says(200, &keys[0]);
    assert!(!list.text.contains("/effects/act"), "{}", list.text);
    let preview = get(
        &console,
        &format!("/effects/act?action=skip&key={}", encoded(&keys[0])),
    );
    assert_eq!(preview.status, 403, "{preview:?}");
    assert!(logged(&path).is_empty());
    assert_eq!(console.terminate(), 0);
}
