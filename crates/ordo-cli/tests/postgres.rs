//! The `ordo` binary on PostgreSQL stores, as real processes against a real
//! server (`ORDO_TEST_PG`, see `pgdb`): the same script gives the same JSON
//! and exit codes on SQLite files and on PostgreSQL; the relay crosses
//! backends both ways and reaches `ordo serve` on a PostgreSQL consumer;
//! bad URLs, unreachable servers and roles without rights fail the way
//! the contract says, and a password is never printed.

mod common;
mod pgdb;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::process::{start_listening, Process};
use common::{
    advance_committed, advance_new, first_advance, keys, line_reader, receipts, row, run, spawn,
    without_store_ids, Lab, Out,
};
use pgdb::Database;
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000_000;

/// One step of the script: arguments (`{P}` and `{C}` stand for the
/// stores) and stdin.
struct Step {
    args: Vec<String>,
    stdin: String,
}

fn step(args: &str) -> Step {
    Step {
        args: args.split_whitespace().map(str::to_owned).collect(),
        stdin: String::new(),
    }
}

fn step_in(args: &str, stdin: String) -> Step {
    Step {
        stdin,
        ..step(args)
    }
}

/// Every command that takes a store, through a life: advance (committed,
/// stale, invalid transition, refused), relay (bounded, drained, one event
/// again), receive with a conflict and a bad payload, apply, block, retry,
/// skip, lists, status, prune, snapshot.
fn script() -> Vec<Step> {
    let conflicting = json!({
        "event_id": "f-1-1", "flow_id": "f-1", "seq": 1, "schema_version": 1,
        "type": "reserved", "payload": {"amount": 6},
    });
    let bad_payload = json!({
        "event_id": "f-4-1", "flow_id": "f-4", "seq": 1, "schema_version": 1,
        "type": "reserved", "payload": {"amount": "six"},
    });
    vec![
        step("init --producer {P} --consumer {C}"),
        step("status --producer {P} --consumer {C}"),
        step("advance --producer {P} --flow f-1 --expected-seq 0 --to reserved --quantity 5"),
        step("advance --producer {P} --flow f-1 --expected-seq 1 --to confirmed"),
        step("advance --producer {P} --flow f-2 --expected-seq 0 --to reserved --quantity 2"),
        step("advance --producer {P} --flow f-1 --expected-seq 0 --to confirmed"),
        step("advance --producer {P} --flow f-2 --expected-seq 1 --to released"),
        step("advance --producer {P} --flow f-2 --expected-seq 1 --to confirmed --quantity 3"),
        step("advance --producer {P} --flow f-3 --expected-seq 0 --to reserved --quantity 4 --schema 2"),
        step("outbox list --producer {P}"),
        step("status --producer {P} --max-backlog 2"),
        step("relay --producer {P} --consumer {C} --max 2"),
        step("relay --producer {P} --consumer {C} --policy first-pending"),
        step("relay --producer {P} --consumer {C} --event f-1-1"),
        step("relay --producer {P} --consumer {C} --event no-such-1"),
        step_in(
            "receive --consumer {C}",
            format!("{conflicting}\n{bad_payload}\n"),
        ),
        step("apply --consumer {C}"),
        step("inbox list --consumer {C}"),
        step("inbox list --consumer {C} --blocked"),
        step("status --consumer {C} --max-blocked 0"),
        step("inbox retry --consumer {C} --flow f-3 --support-v2"),
        step("inbox skip --consumer {C} --flow f-4 --seq 1 --reason bad-amount --by ops"),
        step("inbox repairs --consumer {C}"),
        step("outbox retry --producer {P} f-1-1"),
        step("advance --producer {P} --flow f-1 --expected-seq 2 --to released"),
        step("relay --producer {P} --consumer {C}"),
        step("apply --consumer {C} --flow f-1 --limit 1"),
        step("snapshot --producer {P} --consumer {C}"),
        step("status --producer {P} --consumer {C}"),
        step("prune --producer {P} --consumer {C} --older-than 10s"),
        step("prune --producer {P} --consumer {C} --older-than 0s"),
        step("snapshot --producer {P}"),
        step("snapshot --consumer {C}"),
        step_in(
            "receive --consumer {C}",
            common::reservation("f-2", 1, "reserved", 2),
        ),
    ]
}

/// Runs the script on producer `p` and consumer `c`, step `i` at
/// `T0 + i` seconds, with `--json` (or in text).
fn run_script(p: &str, c: &str, json_mode: bool) -> Vec<Out> {
    let lab = Lab::new();
    script()
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let mut args: Vec<String> = step
                .args
                .iter()
                .map(|a| a.replace("{P}", p).replace("{C}", c))
                .collect();
            if json_mode {
                args.insert(1, "--json".into());
                if args[0] == "outbox" || args[0] == "inbox" {
                    // `--json` after the subcommand's name as well.
                    args.swap(1, 2);
                }
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            lab.at(T0 + i as i64 * 1_000)
                .run_bytes(&args, step.stdin.as_bytes())
        })
        .collect()
}

/// Runs the script on SQLite files and on a PostgreSQL database of its
/// own (both roles in one database: legal on PostgreSQL); the database and
/// the outputs on each.
fn run_script_on_both(json_mode: bool) -> (Database, Vec<Out>, Vec<Out>) {
    let sqlite = Lab::new();
    let db = Database::create();
    let url = db.url();
    let on_files = run_script(&sqlite.p, &sqlite.c, json_mode);
    let on_pg = run_script(&url, &url, json_mode);
    (db, on_files, on_pg)
}

#[test]
fn the_same_script_gives_the_same_json_on_both_backends() {
    let (db, on_files, on_pg) = run_script_on_both(true);
    let url = db.url();
    for ((step, file), pg) in script().iter().zip(&on_files).zip(&on_pg) {
        let name = step.args.join(" ");
        assert_eq!(
            file.code, pg.code,
            "{name}: exit codes differ\n{file:#?}\n{pg:#?}"
        );
        if file.code == 2 {
            file.usage("");
            pg.usage("");
        }
        if file.code != 0 && file.code != 3 {
            continue;
        }
        let parse = |out: &Out| -> Value {
            serde_json::from_str(&out.stdout)
                .unwrap_or_else(|e| panic!("{name}: not one JSON document ({e}): {out:#?}"))
        };
        let (file, pg) = (parse(file), parse(pg));
        if step.args[0] == "init" {
            // The stores are named as given.
            assert_eq!(keys(&file), keys(&pg), "{name}");
            assert_eq!(pg, json!({"producer": url, "consumer": url}), "{name}");
        } else {
            // Each store's identity is its own; the rest is the same.
            let shared = |value| match step.args[0].as_str() {
                "status" => without_store_ids(value),
                "snapshot" => {
                    let mut value = without_store_ids(value);
                    if let Some(consumer) = value.get_mut("consumer") {
                        *consumer = with_senders_masked(consumer.take());
                    }
                    value
                }
                "inbox" => with_senders_masked(value),
                _ => value,
            };
            assert_eq!(shared(file), shared(pg), "{name}: JSON differs");
        }
    }
    // The script reached every state it is meant to.
    let outcome = |i: usize| on_pg[i].json()["outcome"].clone();
    assert_eq!(outcome(2), "committed");
    assert_eq!(outcome(5), "stale");
    assert_eq!(outcome(6), "invalid_transition");
    assert_eq!(on_pg[7].code, 2, "a different quantity is invalid input");
    assert_eq!(on_pg[10].code, 3, "the backlog threshold is breached");
    assert_eq!(on_pg[13].json()["deliveries"][0]["receipt"], "duplicate");
    assert_eq!(on_pg[14].code, 2, "an unknown --event");
    let receipts = on_pg[15].json()["receipts"].clone();
    assert_eq!(receipts[0]["receipt"], "conflict", "{receipts}");
    let apply = on_pg[16].json();
    assert_eq!(
        row(&apply["flows"], "flow_id", "f-3")["reason"],
        "unsupported_schema"
    );
    assert_eq!(
        row(&apply["flows"], "flow_id", "f-4")["reason"],
        "invalid_payload"
    );
    assert_eq!(on_pg[20].json()["applied"], 1, "retry applies f-3");
    assert_eq!(on_pg[22].json()["repairs"][0]["by"], "ops");
    let snapshot = on_pg[27].json();
    assert_eq!(
        row(&snapshot["consumer"]["projection"], "flow_id", "f-1")["state"],
        "released"
    );
    let pruned = on_pg[30].json();
    assert!(pruned["producer"]["removed"].as_u64() > Some(0), "{pruned}");
    assert!(pruned["consumer"]["removed"].as_u64() > Some(0), "{pruned}");
    assert_eq!(
        on_pg[33].json()["receipts"][0]["receipt"],
        "duplicate",
        "a pruned event is still a duplicate"
    );
}

#[test]
fn text_output_is_the_same_on_both_backends() {
    let (_db, on_files, on_pg) = run_script_on_both(false);
    for ((step, file), pg) in script().iter().zip(&on_files).zip(&on_pg) {
        let name = step.args.join(" ");
        assert_eq!(file.code, pg.code, "{name}");
        if step.args[0] != "init" && file.code == 0 {
            assert_eq!(file.stdout, pg.stdout, "{name}");
        }
    }
}

/// Advances `flows` on `p` and relays them to `c`; returns the relay's
/// JSON.
fn produce_and_relay(p: &str, c: &str, flows: &[&str]) -> Value {
    for flow in flows {
        advance_committed(p, flow, 0, "reserved", 3);
    }
    run(&["relay", "--json", "--producer", p, "--consumer", c]).json()
}

#[test]
fn the_relay_crosses_backends_both_ways() {
    let lab = Lab::new();
    let db = Database::create();
    let url = db.url();

    // SQLite producer -> PostgreSQL consumer.
    let relay = produce_and_relay(&lab.p, &url, &["a-1", "a-2"]);
    let accepted = |ids: &[&str]| -> Vec<(String, String)> {
        ids.iter()
            .map(|id| (id.to_string(), "accepted".to_string()))
            .collect()
    };
    assert_eq!(receipts(&relay), accepted(&["a-1-1", "a-2-1"]), "{relay}");
    let applied = run(&["apply", "--json", "--consumer", &url]).json();
    assert_eq!(
        applied["flows"].as_array().map(Vec::len),
        Some(2),
        "{applied}"
    );

    // PostgreSQL producer (same database as that consumer) -> SQLite consumer.
    let relay = produce_and_relay(&url, &lab.c, &["b-1"]);
    assert_eq!(receipts(&relay), accepted(&["b-1-1"]), "{relay}");
    run(&["apply", "--json", "--consumer", &lab.c]).json();

    // Each side holds what the other handed over, and again is a duplicate.
    let pg = run(&["snapshot", "--json", "--producer", &url, "--consumer", &url]).json();
    let files = run(&[
        "snapshot",
        "--json",
        "--producer",
        &lab.p,
        "--consumer",
        &lab.c,
    ])
    .json();
    let ids = |rows: &Value| -> Vec<String> {
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| r["event_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&pg["consumer"]["inbox"]), ["a-1-1", "a-2-1"]);
    assert_eq!(ids(&pg["producer"]["outbox"]), ["b-1-1"]);
    assert_eq!(pg["producer"]["outbox"][0]["accepted"], true);
    let custody = &pg["producer"]["outbox"][0]["destinations"];
    assert_eq!(keys(custody), ["default"], "one destination: {custody}");
    assert_eq!(custody["default"]["accepted"], true);
    assert_eq!(ids(&files["consumer"]["inbox"]), ["b-1-1"]);
    assert_eq!(ids(&files["consumer"]["effects"]), ["b-1-1"]);
    assert_eq!(ids(&pg["consumer"]["effects"]), ["a-1-1", "a-2-1"]);
    let again = run(&[
        "relay",
        "--json",
        "--producer",
        &lab.p,
        "--consumer",
        &url,
        "--event",
        "a-1-1",
    ])
    .json();
    assert_eq!(receipts(&again), [("a-1-1".into(), "duplicate".into())]);
    let again = run(&[
        "relay",
        "--json",
        "--producer",
        &url,
        "--consumer",
        &lab.c,
        "--event",
        "b-1-1",
    ])
    .json();
    assert_eq!(receipts(&again), [("b-1-1".into(), "duplicate".into())]);
}

/// Two events on each of `flows`: reserved, then confirmed.
fn two_events_each(producer: &str, flows: &[&str]) {
    for flow in flows {
        advance_committed(producer, flow, 0, "reserved", 2);
        advance_committed(producer, flow, 1, "confirmed", 2);
    }
}

#[test]
fn flow_events_hands_over_several_events_of_a_flow_per_round() {
    let lab = Lab::new();
    let db = Database::create();
    let url = db.url();
    two_events_each(&url, &["d-1", "d-2"]);
    two_events_each(&lab.p, &["d-1", "d-2"]);
    let first_round = |producer: &str, consumer: &str| -> Vec<String> {
        let relay = run(&[
            "relay",
            "--json",
            "--producer",
            producer,
            "--consumer",
            consumer,
            "--batch",
            "2",
            "--max",
            "2",
            "--flow-events",
            "2",
        ])
        .json();
        receipts(&relay).into_iter().map(|(id, _)| id).collect()
    };
    // Both backends: both events of the first flow in one round.
    assert_eq!(first_round(&url, &url), ["d-1-1", "d-1-2"]);
    assert_eq!(first_round(&lab.p, &lab.c), ["d-1-1", "d-1-2"]);

    for bad in ["0", "1025", "x"] {
        let out = run(&[
            "relay",
            "--producer",
            &url,
            "--consumer",
            &url,
            "--flow-events",
            bad,
        ]);
        assert_eq!(out.code, 2, "--flow-events {bad}: {out:#?}");
    }
}

#[test]
fn a_url_that_does_not_parse_is_invalid_input_and_nothing_is_created() {
    let lab = Lab::new();
    let db = Database::create();
    let bad = "postgres://someone:s3cr3t-word@127.0.0.1:notaport/x";
    let cases: Vec<Vec<&str>> = vec![
        vec!["init", "--producer", &lab.p, "--consumer", bad],
        vec!["relay", "--producer", &lab.p, "--consumer", bad],
        first_advance(bad, "f"),
        vec!["status", "--consumer", bad],
        vec!["serve", "--consumer", bad, "--listen", "127.0.0.1:0"],
    ];
    for args in &cases {
        for json_mode in [false, true] {
            let mut args = args.clone();
            if json_mode {
                args.push("--json");
            }
            let out = run(&args);
            out.usage("not a PostgreSQL connection URL");
            assert!(!out.stderr.contains("s3cr3t"), "{out:#?}");
            lab.assert_no_files();
        }
    }
    // A good producer URL beside a bad consumer URL: nothing in the database.
    let url = db.url();
    run(&["init", "--producer", &url, "--consumer", bad]).usage("not a PostgreSQL connection URL");
    assert!(db.ordo_schemas().is_empty(), "{:?}", db.ordo_schemas());
    // TLS parameters that cannot be used are bad input too.
    let cases = [
        ("sslmode=always", "sslmode=always: one of disable, prefer"),
        (
            "sslmode=verify-full",
            "sslmode=verify-full: needs sslrootcert=FILE",
        ),
        (
            "sslmode=require&sslrootcert=/nonexistent/ca.pem",
            "sslrootcert=/nonexistent/ca.pem",
        ),
        (
            "sslmode=require&sslcert=/nonexistent/c.pem&sslkey=/nonexistent/k.pem",
            "sslcert=/nonexistent/c.pem",
        ),
        (
            "sslmode=require&sslkey=/nonexistent/k.pem",
            "sslkey=/nonexistent/k.pem: needs sslcert=FILE",
        ),
        (
            "sslrootcert=system&sslmode=require",
            "needs sslmode=verify-full (the default with it), not sslmode=require",
        ),
        ("sslrootcert=%2Ftmp%2Fca.pem", "sslrootcert without sslmode"),
    ];
    for (params, words) in cases {
        let consumer = format!("{url}?{params}");
        run(&["init", "--producer", &url, "--consumer", &consumer]).usage(words);
        assert!(db.ordo_schemas().is_empty(), "{:?}", db.ordo_schemas());
    }
}

#[test]
fn a_url_asking_for_tls_connects_with_it() {
    let lab = Lab::new();
    let db = Database::create();
    let url = db.url();
    let secured = format!("{url}?sslmode=require");
    let out = run(&[
        "init",
        "--producer",
        &secured,
        "--consumer",
        &secured,
        "--json",
    ]);
    assert_eq!(out.code, 0, "{out:#?}");
    let out = run(&["status", "--consumer", &secured, "--json"]);
    assert_eq!(out.code, 0, "{out:#?}");
    // A certificate no CA of sslrootcert signed: the connection fails
    // (exit 1, one line). The CA trusted is a certificate of the test's
    // own, not the server's.
    let other = lab.path("other-ca.pem");
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(&other, ca.cert.pem()).unwrap();
    let untrusted = format!("{url}?sslmode=verify-ca&sslrootcert={other}");
    let out = run(&["status", "--consumer", &untrusted, "--json"]);
    assert_eq!(out.code, 1, "{out:#?}");
    assert_eq!(out.stderr.lines().count(), 1, "{out:#?}");
    assert!(out.stderr.contains("UnknownIssuer"), "{out:#?}");
}

#[test]
fn a_path_is_a_file_unless_it_starts_with_the_schemes() {
    let lab = Lab::new();
    for name in ["postgres:x.db", "file:y.db", "postgresql:z.db"] {
        let path = lab.path(name);
        run(&["init", "--json", "--producer", &path]).json();
        assert!(std::path::Path::new(&path).exists(), "{path}");
    }
    // Relative, as given on the command line: still a file.
    let out = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["init", "--json", "--consumer", "postgres:rel.db"])
        .current_dir(lab.dir.path())
        .output()
        .expect("ordo runs");
    assert!(out.status.success(), "{out:?}");
    assert!(lab.dir.path().join("postgres:rel.db").exists());
}

#[test]
fn an_unreachable_server_exits_1_naming_it_without_the_password() {
    let lab = Lab::new();
    let url = "postgres://someone:s3cr3t-word@127.0.0.1:1/nothing";
    let cases: Vec<Vec<&str>> = vec![
        vec!["status", "--producer", url],
        vec!["init", "--producer", &lab.p, "--consumer", url],
        vec!["relay", "--producer", url, "--consumer", &lab.c],
        vec!["snapshot", "--json", "--consumer", url],
    ];
    for args in &cases {
        let out = run(args);
        out.storage_error();
        assert_eq!(out.stderr.lines().count(), 1, "one line: {out:#?}");
        assert!(
            out.stderr.contains("someone@127.0.0.1:1/nothing"),
            "{out:#?}"
        );
        assert!(!out.stderr.contains("s3cr3t"), "{out:#?}");
        lab.assert_no_files();
    }
}

/// A login role without any privilege beyond connecting; dropped with the
/// value (after the databases it was used on).
struct Role {
    name: String,
    admin: ordo_postgres::postgres::Client,
}

impl Role {
    fn create(db: &Database) -> Role {
        let name = format!("ordo_cli_norights_{}", std::process::id());
        let mut admin = db.client();
        admin
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {name}; CREATE ROLE {name} LOGIN"
            ))
            .expect("create a role");
        Role { name, admin }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP ROLE IF EXISTS {}", self.name));
    }
}

#[test]
fn a_role_without_rights_exits_1_with_the_sqlstate() {
    let db = Database::create();
    let role = Role::create(&db);
    let server = pgdb::server();
    let host = server.split_once('@').map_or(server.as_str(), |(_, h)| h);
    let url = format!("postgres://{}:pw-of-role@{host}/{}", role.name, db.name);
    let out = run(&["init", "--json", "--producer", &url]);
    out.storage_error();
    assert!(out.stderr.contains("SQLSTATE 42501"), "{out:#?}");
    assert!(out.stderr.contains(&role.name), "{out:#?}");
    assert!(!out.stderr.contains("pw-of-role"), "{out:#?}");
    assert!(db.ordo_schemas().is_empty());
}

#[test]
fn a_store_of_another_domain_or_a_newer_version_exits_2() {
    let db = Database::create();
    let url = db.url();
    let init = run(&[
        "init",
        "--json",
        "--producer",
        &url,
        "--consumer",
        &url,
        "--domain",
        "orders",
    ]);
    init.json();
    run(&first_advance(&url, "f"))
        .usage("belongs to domain \"orders\"; its handler runs in the application");
    run(&["apply", "--consumer", &url]).usage("belongs to domain \"orders\"");
    run(&["init", "--producer", &url, "--domain", "shipping"]).usage("not \"shipping\"");
    let snapshot = run(&["snapshot", "--json", "--producer", &url, "--consumer", &url]).json();
    assert_eq!(snapshot["producer"]["flows"], json!([]));
    assert_eq!(snapshot["consumer"]["projection"], json!([]));
    assert_eq!(snapshot["consumer"]["effects"], json!([]));

    // A newer version of ordo's tables: refused, nothing written.
    db.client()
        .batch_execute(
            "UPDATE ordo_consumer.ordo_meta SET value = '99' WHERE key = 'schema_version'",
        )
        .expect("bump the version");
    let envelope = common::reservation("f", 1, "reserved", 1);
    let out = common::run_bytes(
        &["receive", "--json", "--consumer", &url],
        envelope.as_bytes(),
    );
    out.usage("schema version 99");
    run(&["status", "--consumer", &url]).usage("schema version 99");
    let stored: i64 = db
        .client()
        .query_one("SELECT count(*) FROM ordo_consumer.inbox", &[])
        .expect("count")
        .get(0);
    assert_eq!(stored, 0);
}

#[test]
fn adopt_refuses_a_url_and_serve_creates_nothing() {
    let lab = Lab::new();
    let db = Database::create();
    let url = db.url();
    run(&["init", "--adopt", "--producer", &lab.p, "--consumer", &url])
        .usage("--adopt is for SQLite files");
    lab.assert_no_files();
    assert!(db.ordo_schemas().is_empty(), "{:?}", db.ordo_schemas());
    // A missing store is never created by serve or the follow modes.
    run(&["serve", "--consumer", &url, "--listen", "127.0.0.1:0"]).usage("does not exist");
    run(&[
        "serve",
        "--apply",
        "--consumer",
        &url,
        "--listen",
        "127.0.0.1:0",
    ])
    .usage("does not exist");
    run(&["apply", "--follow", "--consumer", &url]).usage("holds no ordo consumer store");
    run(&["relay", "--follow", "--producer", &url, "--consumer", &url])
        .usage("holds no ordo producer store");
    assert!(db.ordo_schemas().is_empty(), "{:?}", db.ordo_schemas());
}

/// The longest a test waits for a running process to do what it should
/// do at once.
const PATIENCE: Duration = Duration::from_secs(30);

/// A running `ordo` whose stdout lines arrive on a channel; killed when
/// dropped.
struct Running {
    child: Process,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        let mut child = spawn(args);
        let lines = line_reader(child.stdout.take().expect("piped"));
        Running {
            child: Process(child),
            lines,
        }
    }

    /// `ordo relay --follow --json` from `producer` into `consumer`.
    fn relay_follow(producer: &str, consumer: &str) -> Running {
        Running::start(&[
            "relay",
            "--follow",
            "--json",
            "--producer",
            producer,
            "--consumer",
            consumer,
        ])
    }

    /// Reads JSON round lines until `key` adds up to `total`.
    #[track_caller]
    fn until_total(&self, key: &str, total: u64) {
        let mut sum = 0;
        while sum < total {
            let line = self
                .lines
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|_| panic!("{key} stays at {sum} of {total}"));
            let round: Value = serde_json::from_str(&line).expect("a JSON round line");
            sum += round[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{key} in {line}"));
        }
        assert_eq!(sum, total);
    }

    /// SIGTERM; the exit code.
    fn stop(mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        self.child.wait().expect("exits").code()
    }
}

#[test]
fn the_follow_modes_and_serve_apply_run_on_postgres() {
    let db = Database::create();
    let url = db.url();
    let lab = Lab::new();
    run(&["init", "--producer", &url, "--consumer", &url]).text();
    for flow in ["w-1", "w-2", "w-3"] {
        advance_new(&url, flow);
    }
    let relay = Running::relay_follow(&url, &url);
    relay.until_total("delivered", 3);
    // Work committed while it runs is found too.
    advance_new(&url, "w-4");
    relay.until_total("accepted", 1);
    assert_eq!(relay.stop(), Some(0));

    let apply = Running::start(&["apply", "--follow", "--json", "--consumer", &url]);
    apply.until_total("applied", 4);
    assert_eq!(apply.stop(), Some(0));
    let snapshot = run(&["snapshot", "--json", "--consumer", &url]).json();
    assert_eq!(
        snapshot["consumer"]["effects"].as_array().map(Vec::len),
        Some(4)
    );

    // A PostgreSQL producer following into an SQLite consumer: another
    // consumer store, so another destination (the first recorded its own).
    run(&["init", "--consumer", &lab.c]).text();
    switch_destination(&url, "default", "lab");
    let relay = Running::relay_follow(&url, &lab.c);
    advance_new(&url, "w-5");
    relay.until_total("accepted", 1);
    assert_eq!(relay.stop(), Some(0));

    // serve --apply on a PostgreSQL consumer of its own.
    let served = Database::create();
    let consumer = served.url();
    run(&["init", "--consumer", &consumer]).text();
    let serve = Running::start(&[
        "serve",
        "--apply",
        "--consumer",
        &consumer,
        "--listen",
        "127.0.0.1:0",
    ]);
    let first = serve
        .lines
        .recv_timeout(PATIENCE)
        .expect("the listening line");
    let addr = first
        .strip_prefix("listening on ")
        .expect("listening on ADDR");
    let to = format!("http://{addr}");
    switch_destination(&url, "lab", "served");
    let status = run(&["status", "--json", "--producer", &url]).json();
    assert_eq!(status["producer"]["backlog"], 0, "{status}");
    advance_new(&url, "w-6");
    let relay = run(&["relay", "--json", "--producer", &url, "--to", &to]).json();
    assert_eq!(receipts(&relay), [("w-6-1".into(), "accepted".into())]);
    // The applier in the server applies it (waited for, not timed).
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let snapshot = run(&["snapshot", "--json", "--consumer", &consumer]).json();
        if snapshot["consumer"]["effects"].as_array().map(Vec::len) == Some(1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never applied: {snapshot}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(serve.stop(), Some(0));
}

/// Adds the destination `to` (`--from now`) to the producer store at `url`
/// and removes `from`, so that its relay goes to another consumer store.
fn switch_destination(url: &str, from: &str, to: &str) {
    let add = ["destination", "add", "--producer", url, "--from", "now", to];
    run(&add).text();
    run(&[
        "destination",
        "remove",
        "--producer",
        url,
        from,
        "--by",
        "test",
        "--reason",
        "another consumer store",
    ])
    .text();
}

/// A running `ordo serve`; killed when dropped.
struct Serve {
    child: Process,
    addr: String,
}

impl Serve {
    fn start(consumer: &str) -> Serve {
        let (child, addr) = start_listening(
            Command::new(env!("CARGO_BIN_EXE_ordo"))
                .args(["serve", "--consumer", consumer, "--listen", "127.0.0.1:0"])
                .env_remove("ORDO_CRASH_POINT")
                .stderr(Stdio::piped()),
            "ordo serve",
        );
        Serve { child, addr }
    }

    /// Stops the server with SIGTERM; its exit status and stderr.
    fn stop(mut self) -> (Option<i32>, String) {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        let status = self.child.wait().expect("serve exits");
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            pipe.read_to_string(&mut stderr).expect("stderr");
        }
        (status.code(), stderr)
    }
}

#[test]
fn a_postgres_producer_relays_to_serve_on_a_postgres_consumer() {
    let producer_db = Database::create();
    let consumer_db = Database::create();
    let (consumer, password) = consumer_db.url_with_password("s3cr3t-word");
    let producer = producer_db.url();
    run(&["init", "--consumer", &consumer]).text();
    let serve = Serve::start(&consumer);
    let to = format!("http://{}", serve.addr);
    for flow in ["h-1", "h-2"] {
        advance_new(&producer, flow);
    }
    let relay = run(&["relay", "--json", "--producer", &producer, "--to", &to]).json();
    assert_eq!(
        receipts(&relay),
        [
            ("h-1-1".to_string(), "accepted".to_string()),
            ("h-2-1".to_string(), "accepted".to_string())
        ]
    );
    let again = run(&[
        "relay",
        "--json",
        "--producer",
        &producer,
        "--to",
        &to,
        "--event",
        "h-2-1",
    ])
    .json();
    assert_eq!(receipts(&again), [("h-2-1".into(), "duplicate".into())]);
    let (code, stderr) = serve.stop();
    assert_eq!(code, Some(0), "{stderr}");
    if !password.is_empty() {
        assert!(!stderr.contains(&password), "{stderr}");
    }
    let applied = run(&["apply", "--json", "--consumer", &consumer]).json();
    assert_eq!(
        applied["flows"].as_array().map(Vec::len),
        Some(2),
        "{applied}"
    );
    let status = run(&["status", "--json", "--producer", &producer]).json();
    assert_eq!(status["producer"]["backlog"], 0, "{status}");
}

#[test]
fn a_password_in_the_url_is_never_printed() {
    let db = Database::create();
    let (url, password) = db.url_with_password("s3cr3t-word");
    let shown = url.replace(&format!(":{password}@"), ":***@");
    let lab = Lab::new();
    let runs: Vec<(Out, bool)> = vec![
        (run(&["init", "--producer", &url, "--consumer", &url]), true),
        (
            run(&["init", "--json", "--producer", &url, "--consumer", &url]),
            true,
        ),
        (
            run(&["init", "--producer", &url, "--domain", "orders"]),
            true,
        ),
        (run(&first_advance(&url, "f")), false),
        (
            run(&["relay", "--producer", &url, "--consumer", &lab.c]),
            false,
        ),
        (run(&["init", "--adopt", "--producer", &url]), true),
        (
            run(&["status", "--producer", &url, "--consumer", &url]),
            false,
        ),
        (
            run(&["snapshot", "--producer", &url, "--consumer", &url]),
            false,
        ),
        (run(&["apply", "--consumer", &url]), false),
        (
            run(&["serve", "--consumer", &url, "--listen", "not-an-address"]),
            false,
        ),
    ];
    for (out, names_store) in &runs {
        assert!(out.code == 0 || out.code == 2, "{out:#?}");
        let printed = format!("{}{}", out.stdout, out.stderr);
        assert!(!printed.contains(&password), "{out:#?}");
        if *names_store {
            assert!(
                printed.contains(&shown),
                "names the store as {shown}: {out:#?}"
            );
        }
    }
    let init = runs[1].0.json();
    assert_eq!(init, json!({"producer": shown, "consumer": shown}));
}

/// `inbox list`'s JSON with each row's delivering store (its own per
/// backend's producer) shown only as known or not.
fn with_senders_masked(mut value: Value) -> Value {
    for row in value["inbox"].as_array_mut().into_iter().flatten() {
        if row["store_id"].is_string() {
            row["store_id"] = Value::from("the producer store");
        }
    }
    value
}
