//! `ordo effects list|retry|resolve|skip` and `status`'s effects on a real
//! consumer file, whose intents a handler of its own domain recorded
//! through the library (EFFECTS.md, CLI.md "Effects").

mod common;
mod pgdb;

use std::sync::Arc;

use common::{run, run_at, Out};
use ordo_core::effect::{self, EffectName, EffectPolicy, Policies, Settle};
use ordo_core::{
    process_all, ApplyContext, Clock, ConsumerOps, Envelope, Receive, StoreError, SystemClock,
    Verdict,
};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, OpenOptions, Schema};
use serde_json::{json, Value};

/// A consumer file with five intents:
/// - `default/o-1/1/notify` pending, `default/o-1/2/notify` pending and
///   waiting on it;
/// - `default/o-2/1/mail` outcome_unknown, `default/o-2/1/notify` pending
///   and waiting on it;
/// - `billing/o-1/1/notify` pending.
struct Fixture {
    _dir: tempfile::TempDir,
    c: String,
    store_id: String,
}

impl Fixture {
    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.store_id)
    }

    fn run(&self, args: &[&str]) -> Out {
        let mut all = args.to_vec();
        all.extend(["--consumer", &self.c]);
        run(&all)
    }

    fn list(&self, extra: &[&str]) -> Vec<Value> {
        let mut args = vec!["--json", "effects", "list"];
        args.extend(extra);
        let value = self.run(&args).json();
        value["effects"]
            .as_array()
            .expect("effects is a list")
            .clone()
    }

    fn state(&self, key: &str) -> String {
        let rows = self.list(&[]);
        let row = rows
            .iter()
            .find(|r| r["key"] == key)
            .expect("the key is listed");
        row["state"].as_str().unwrap().to_owned()
    }

    fn repairs(&self) -> Vec<Value> {
        let value = self.run(&["--json", "inbox", "repairs"]).json();
        value["repairs"].as_array().unwrap().clone()
    }

    /// Runs `effects ACTION --key KEY ... --by ops --reason why`.
    fn act(&self, action: &[&str], key: &str) -> Out {
        let mut args = vec!["--json", "effects"];
        args.extend(action);
        args.extend(["--key", key, "--by", "ops", "--reason", "checked by hand"]);
        self.run(&args)
    }

    /// Asserts that `out` is exit 2 naming `needle`, and that neither the
    /// intents nor the repair log changed.
    #[track_caller]
    fn refused(&self, out: impl FnOnce() -> Out, needle: &str) {
        let (intents, repairs) = (self.list(&[]), self.repairs());
        out().usage(needle);
        assert_eq!(self.list(&[]), intents, "the intents are unchanged");
        assert_eq!(self.repairs(), repairs, "the repair log is unchanged");
    }
}

fn event(producer: &str, flow: &str, seq: i64, kind: &str) -> Envelope {
    // The default producer's envelope leaves `producer` out.
    let named = match producer {
        "default" => String::new(),
        name => format!(r#""producer": "{name}","#),
    };
    Envelope::parse_str(&format!(
        r#"{{"event_id": "{producer}-{flow}-{seq}", "flow_id": "{flow}", "seq": {seq}, {named}
            "schema_version": 1, "type": "{kind}", "payload": {{"n": {seq}}}}}"#
    ))
    .unwrap()
}

/// Records `notify` for every event, after `mail` for `mailed`.
fn handler(cx: &mut ApplyContext<Connection>, e: &Envelope) -> Result<Verdict, StoreError> {
    if e.event_type.as_str() == "mailed" {
        cx.effect("mail", &json!({"to": "someone@example.com"}))?;
    }
    cx.effect("notify", &json!({"seq": e.seq.get()}))?;
    Ok(Verdict::Apply)
}

/// An executor of `mail` that claims and never answers.
struct Mail;

impl Policies for Mail {
    fn of(&self, _: &EffectName) -> Option<(EffectPolicy, bool)> {
        Some((EffectPolicy::default(), false))
    }

    fn names(&self) -> Vec<EffectName> {
        vec![EffectName::new("mail").unwrap()]
    }
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumer.db");
    let schema = Schema::new("shop").unwrap();
    let clock = Arc::new(SystemClock);
    let mut db = ConsumerDb::open_with(&path, &schema, clock, &OpenOptions::default()).unwrap();
    for e in [
        event("default", "o-1", 1, "placed"),
        event("default", "o-1", 2, "placed"),
        event("default", "o-2", 1, "mailed"),
        event("billing", "o-1", 1, "placed"),
    ] {
        db.receive(&e).unwrap();
    }
    process_all(&mut db, None, &mut handler, 256).unwrap();
    let now_ms = SystemClock.now_ms();
    let round = effect::claim(&mut db, &Mail, "test", now_ms, 8).unwrap();
    assert_eq!(round.claimed.len(), 1);
    let unknown = Settle::OutcomeUnknown {
        error: "timed out after sending".into(),
    };
    assert!(effect::record(&mut db, &round.claimed[0], &unknown, now_ms).unwrap());
    let store_id = db.store_id().to_string();
    drop(db);
    let c = path.to_str().unwrap().to_owned();
    Fixture {
        _dir: dir,
        c,
        store_id,
    }
}

fn keys(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn list_shows_every_intent_and_each_filter_selects() {
    let f = fixture();
    let rows = f.list(&[]);
    assert_eq!(rows.len(), 5, "{rows:#?}");
    let first = rows
        .iter()
        .find(|r| r["key"] == f.key("default/o-1/1/notify"))
        .unwrap();
    let fields: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    let mut expected = vec![
        "key",
        "name",
        "producer",
        "flow_id",
        "seq",
        "state",
        "attempts",
        "request",
        "result",
        "last_error",
        "waiting_on",
        "next_attempt_at_ms",
        "updated_at_ms",
    ];
    expected.sort_unstable();
    let mut fields = fields;
    fields.sort_unstable();
    assert_eq!(fields, expected);
    assert_eq!(
        first["request"],
        json!({"seq": 1}),
        "a JSON value, not a string"
    );
    assert_eq!(
        (first["producer"].as_str(), first["flow_id"].as_str()),
        (Some("default"), Some("o-1"))
    );
    assert_eq!(
        (first["seq"].as_i64(), first["attempts"].as_i64()),
        (Some(1), Some(0))
    );
    assert_eq!(first["state"], "pending");
    let second = rows
        .iter()
        .find(|r| r["key"] == f.key("default/o-1/2/notify"))
        .unwrap();
    assert_eq!(second["waiting_on"], f.key("default/o-1/1/notify"));

    let unknown = f.list(&["--state", "outcome_unknown"]);
    assert_eq!(keys(&unknown), [f.key("default/o-2/1/mail")]);
    assert_eq!(unknown[0]["attempts"], 1);
    assert_eq!(unknown[0]["last_error"], "timed out after sending");
    assert_eq!(
        keys(&f.list(&["--name", "mail"])),
        [f.key("default/o-2/1/mail")]
    );
    assert_eq!(
        keys(&f.list(&["--producer-name", "billing"])),
        [f.key("billing/o-1/1/notify")]
    );
    assert_eq!(f.list(&["--state", "pending", "--name", "notify"]).len(), 4);
    assert!(f.list(&["--state", "skipped"]).is_empty());

    let cut = f.run(&["--json", "effects", "list", "--limit", "2"]).json();
    assert_eq!(cut["effects"].as_array().unwrap().len(), 2);
    assert_eq!(cut["truncated"], true);
    assert_eq!(
        f.run(&["--json", "effects", "list"]).json()["truncated"],
        false
    );
    let text = f.run(&["effects", "list"]);
    assert!(text.text().contains("5 intents"), "{text:#?}");

    f.run(&["effects", "list", "--state", "done"])
        .usage("--state");
    f.run(&["effects", "list", "--name", "No"]).usage("--name");
}

#[test]
fn list_and_actions_never_create_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("missing.db");
    let c = c.to_str().unwrap();
    run(&["effects", "list", "--consumer", c]).usage("does not exist");
    let key = "0123456789abcdef0123456789abcdef/default/o-1/1/notify";
    let args = [
        "effects",
        "skip",
        "--consumer",
        c,
        "--key",
        key,
        "--by",
        "a",
        "--reason",
        "b",
    ];
    run(&args).usage("does not exist");
    assert!(!std::path::Path::new(c).exists());
}

#[test]
fn skip_retry_and_resolve_follow_the_states_table_and_are_audited() {
    let f = fixture();
    let pending = f.key("default/o-1/1/notify");
    let unknown = f.key("default/o-2/1/mail");

    // skip: pending -> skipped, logged with its key.
    let out = f.act(&["skip"], &pending).json();
    assert_eq!(out["effect"]["state"], "skipped");
    assert_eq!(f.state(&pending), "skipped");
    let repairs = f.repairs();
    let last = repairs.last().unwrap();
    assert_eq!(last["action"], "effect_skip");
    assert_eq!(last["key"], pending.as_str());
    assert_eq!(
        (last["by"].as_str(), last["reason"].as_str()),
        (Some("ops"), Some("checked by hand"))
    );
    assert_eq!(
        (last["flow_id"].as_str(), last["seq"].as_i64()),
        (Some("o-1"), Some(1))
    );
    // Every action on a skipped intent is refused.
    for action in [
        &["skip"][..],
        &["retry"],
        &["resolve", "--as", "failed"],
        &["resolve", "--as", "succeeded"],
    ] {
        f.refused(|| f.act(action, &pending), "skipped");
    }

    // retry: outcome_unknown -> pending (the operator's decision to call again).
    assert_eq!(
        f.act(&["retry"], &unknown).json()["effect"]["state"],
        "pending"
    );
    assert_eq!(f.state(&unknown), "pending");
    assert_eq!(f.repairs().last().unwrap()["action"], "effect_retry");
    // resolve --as failed: pending -> failed; then --as succeeded with a result.
    f.act(&["resolve", "--as", "failed"], &unknown).json();
    assert_eq!(f.state(&unknown), "failed");
    let resolved = f
        .act(
            &["resolve", "--as", "succeeded", "--result", r#"{"id":7}"#],
            &unknown,
        )
        .json();
    assert_eq!(resolved["effect"]["state"], "succeeded");
    let row = &f.list(&["--name", "mail"])[0];
    assert_eq!(
        row["result"],
        json!({"id": 7}),
        "a JSON value, not a string"
    );
    let actions: Vec<Value> = f.repairs().iter().map(|r| r["action"].clone()).collect();
    assert_eq!(
        actions,
        [
            "effect_skip",
            "effect_retry",
            "effect_resolve_failed",
            "effect_resolve_succeeded"
        ]
    );
    // A succeeded intent refuses every action.
    f.refused(|| f.act(&["retry"], &unknown), "succeeded");
    f.refused(|| f.act(&["skip"], &unknown), "succeeded");
    // A pending one cannot be resolved as succeeded.
    let other = f.key("default/o-2/1/notify");
    f.refused(
        || f.act(&["resolve", "--as", "succeeded"], &other),
        "pending",
    );
    assert_eq!(f.state(&other), "pending");
}

#[test]
fn bad_input_exits_2_writing_nothing() {
    let f = fixture();
    let pending = f.key("default/o-1/1/notify");
    f.refused(|| f.act(&["skip"], "no-slashes-here"), "--key");
    f.refused(
        || f.act(&["skip"], &f.key("default/o-9/1/notify")),
        "no effect intent",
    );
    f.refused(
        || f.act(&["resolve", "--as", "succeeded", "--result", "{"], &pending),
        "--result",
    );
    f.refused(
        || f.act(&["resolve", "--as", "failed", "--result", "{}"], &pending),
        "--result",
    );
    f.refused(|| f.act(&["resolve", "--as", "maybe"], &pending), "--as");
    let blank_by = [
        "--json", "effects", "skip", "--key", &pending, "--by", " ", "--reason", "r",
    ];
    f.refused(|| f.run(&blank_by), "--by");
    let blank_reason = [
        "--json", "effects", "retry", "--key", &pending, "--by", "ops", "--reason", "",
    ];
    f.refused(|| f.run(&blank_reason), "--reason");
    let missing = [
        "--json", "effects", "skip", "--key", &pending, "--by", "ops",
    ];
    f.refused(|| f.run(&missing), "--reason");
    assert_eq!(f.state(&pending), "pending");
}

#[test]
fn status_counts_the_effects_and_alerts_past_max_unknown_effects() {
    let f = fixture();
    let status = f.run(&["--json", "status"]).json();
    let effects = &status["consumer"]["effects"];
    let mut fields: Vec<&str> = effects
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "failed",
            "in_flight",
            "oldest_pending_age_s",
            "outcome_unknown",
            "pending",
            "skipped",
            "succeeded"
        ]
    );
    assert_eq!(
        (
            effects["pending"].as_u64(),
            effects["outcome_unknown"].as_u64()
        ),
        (Some(4), Some(1))
    );
    assert_eq!(
        (effects["succeeded"].as_u64(), effects["in_flight"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(effects["oldest_pending_age_s"].as_f64().unwrap() >= 0.0);

    let ok = f
        .run(&["--json", "status", "--max-unknown-effects", "1"])
        .json();
    assert_eq!(ok["ok"], true);
    let alert = f.run(&["--json", "status", "--max-unknown-effects", "0"]);
    assert_eq!(alert.code, 3, "{alert:#?}");
    let value: Value = serde_json::from_str(&alert.stdout).unwrap();
    assert_eq!(value["ok"], false);
    assert_eq!(
        value["breaches"],
        json!([{"signal": "outcome_unknown", "value": 1, "threshold": 0}])
    );
    let text = f.run(&["status", "--max-unknown-effects", "0"]);
    assert_eq!(text.code, 3);
    assert!(text.stdout.contains("effects: pending 4"), "{text:#?}");
    assert!(text.stdout.contains("outcome unknown 1"), "{text:#?}");
    assert!(
        text.stdout.contains("ALERT outcome_unknown = 1 > 0"),
        "{text:#?}"
    );

    // Settled by an operator, the alert clears.
    f.act(&["skip"], &f.key("default/o-2/1/mail")).json();
    let cleared = f
        .run(&["--json", "status", "--max-unknown-effects", "0"])
        .json();
    assert_eq!(cleared["consumer"]["effects"]["skipped"], 1);
    run_at(None, &["status", "--max-unknown-effects", "0"], b"").usage("--consumer");
}

/// The same commands on a PostgreSQL consumer, whose intents the
/// reservation domain recorded (`apply --webhook`).
#[test]
fn postgres_lists_settles_and_counts_the_intents() {
    let db = pgdb::Database::create();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("producer.db");
    let lab = common::Lab::with_stores(p.to_str().unwrap(), &db.url());
    lab.init();
    lab.full_flow("o-1", 2);
    lab.relay(&[]);
    lab.apply(&["--webhook", "http://127.0.0.1:9/hook"]);
    let c = db.url();
    let list = |extra: &[&str]| {
        let mut args = vec!["--json", "effects", "list", "--consumer", &c];
        args.extend(extra);
        run(&args).json()["effects"].as_array().unwrap().clone()
    };
    let rows = list(&[]);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert!(rows
        .iter()
        .all(|r| r["name"] == "webhook" && r["state"] == "pending"));
    assert_eq!(rows[0]["request"]["url"], "http://127.0.0.1:9/hook");
    assert_eq!(rows[1]["waiting_on"], rows[0]["key"]);
    let first = rows[0]["key"].as_str().unwrap().to_owned();
    let act = |action: &[&str], key: &str| {
        let mut args = vec!["--json", "effects"];
        args.extend(action);
        args.extend([
            "--consumer",
            &c,
            "--key",
            key,
            "--by",
            "ops",
            "--reason",
            "why",
        ]);
        run(&args)
    };
    act(&["resolve", "--as", "failed"], &first).json();
    act(&["skip"], &first).json();
    act(&["retry"], &first).usage("skipped");
    let unknown = first.replace("/webhook", "/mail");
    act(&["skip"], &unknown).usage("no effect intent");
    assert_eq!(list(&["--state", "skipped"]).len(), 1);
    let repairs = run(&["--json", "inbox", "repairs", "--consumer", &c]).json();
    let repairs = repairs["repairs"].as_array().unwrap();
    assert_eq!(repairs.len(), 2);
    assert!(repairs.iter().all(|r| r["key"] == first.as_str()));
    let status = run(&[
        "--json",
        "status",
        "--consumer",
        &c,
        "--max-unknown-effects",
        "0",
    ]);
    let effects = &status.json()["consumer"]["effects"];
    assert_eq!(
        (effects["pending"].as_u64(), effects["skipped"].as_u64()),
        (Some(2), Some(1))
    );
}
