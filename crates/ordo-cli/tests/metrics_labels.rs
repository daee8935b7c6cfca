//! The labels of the metrics (HTTP.md, Metrics): outbox and relay metrics
//! carry the `destination` a `relay --follow` delivers to, with that
//! destination's own values, and the inbox metrics of `serve` and
//! `apply --follow` the `producer` whose events they count, as real `ordo`
//! processes on real SQLite files, scraped over HTTP.

mod common;

use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::process::Process;
use common::{http_get, line_reader, reservation, Lab, Serve};
use serde_json::{json, Value};

const PATIENCE: Duration = Duration::from_secs(30);

/// A follow mode with its metrics on any free port; killed when dropped.
/// Its log lines are read until then (a follow mode whose stderr is
/// closed fails at its next log line).
struct Follow {
    _child: Process,
    _logs: Receiver<String>,
    addr: String,
}

impl Follow {
    fn start(args: &[&str]) -> Follow {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
            .args(args)
            .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
            .env_remove("ORDO_CRASH_POINT")
            .env_remove("ORDO_NOW_MS")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ordo starts");
        let logs = line_reader(child.stderr.take().expect("piped"));
        let addr = loop {
            let line = logs.recv_timeout(PATIENCE).expect("a log line");
            let log: Value = serde_json::from_str(&line).expect("a JSON log line");
            if log["fields"]["message"] == "serving metrics" {
                break log["fields"]["addr"].as_str().expect("addr").to_owned();
            }
        };
        Follow {
            _child: Process(child),
            _logs: logs,
            addr,
        }
    }
}

/// Scrapes `/metrics` at `addr` until every line of `samples` is in it
/// (the gauges are read from the store every second, or at the scrape);
/// the exposition, or a failure with the last one.
#[track_caller]
fn until_exposes(addr: &str, samples: &[&str]) -> String {
    let started = Instant::now();
    loop {
        let exposition = http_get(addr, "/metrics");
        let missing: Vec<_> = (samples.iter())
            .filter(|s| !exposition.lines().any(|line| line == **s))
            .collect();
        if missing.is_empty() {
            return exposition;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{missing:?} missing in {exposition}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a sample line of `exposition` starts with `start`.
fn has_sample(exposition: &str, start: &str) -> bool {
    exposition.lines().any(|line| line.starts_with(start))
}

/// `ordo ARGS` on the lab, expected to exit 0; its stdout as JSON.
#[track_caller]
fn ok(lab: &Lab, args: &[&str]) -> Value {
    let out = lab.run(args);
    assert_eq!(out.code, 0, "{args:?}: {out:#?}");
    out.json()
}

/// `relay --json` once from the lab's producer to `consumer` for
/// `destination`: its receipts as `(event_id, receipt)`.
fn relay_once(lab: &Lab, consumer: &str, destination: &str) -> Vec<(String, String)> {
    let args = [
        "relay",
        "--json",
        "--producer",
        &lab.p,
        "--consumer",
        consumer,
    ];
    let report = ok(lab, &[&args[..], &["--destination", destination]].concat());
    common::receipts(&report)
}

/// Puts `backup` in place of the producer's file, its WAL and shared
/// memory files gone with it.
fn restore(producer: &str, backup: &str) {
    for side in ["-wal", "-shm"] {
        match std::fs::remove_file(format!("{producer}{side}")) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("{producer}{side}: {e}"),
        }
    }
    std::fs::copy(backup, producer).expect("the backup is restored");
}

/// A producer with destinations `default` (consumer `c`) and `audit`
/// (consumer `c2.db`, nothing relayed there yet), restored from a backup
/// after `default` took b-1: `default` holds a-1 and c-1, quarantines the
/// new b-1 as rewound (backlog 1), and `audit` waits for a-1, b-1 and c-1
/// (backlog 3). Returns the lab and `c2.db`.
fn two_destinations_one_rewound() -> (Lab, String) {
    let lab = Lab::new();
    lab.init();
    let c2 = lab.path("c2.db");
    ok(&lab, &["init", "--json", "--consumer", &c2]);
    ok(
        &lab,
        &[
            "destination",
            "add",
            "audit",
            "--json",
            "--producer",
            &lab.p,
        ],
    );
    lab.advance("a", 0, "reserved", Some(1));
    assert_eq!(relay_once(&lab, &lab.c, "default").len(), 1);
    let backup = lab.path("backup.db");
    std::fs::copy(&lab.p, &backup).expect("a backup");
    lab.advance("b", 0, "reserved", Some(1));
    assert_eq!(relay_once(&lab, &lab.c, "default").len(), 1);
    restore(&lab.p, &backup);
    lab.advance("b", 0, "reserved", Some(2));
    lab.advance("c", 0, "reserved", Some(1));
    let receipts = relay_once(&lab, &lab.c, "default");
    assert!(
        receipts.contains(&("b-1".to_owned(), "conflict".to_owned())),
        "{receipts:?}"
    );
    let status = ok(&lab, &["status", "--json", "--producer", &lab.p]);
    let destinations = &status["producer"]["destinations"];
    let signals = |name: &str| {
        let d = &destinations[name];
        (
            d["backlog"].clone(),
            d["quarantined"].clone(),
            d["rewound"].clone(),
        )
    };
    assert_eq!(
        signals("default"),
        (json!(1), json!(1), json!(1)),
        "{status}"
    );
    assert_eq!(signals("audit"), (json!(3), json!(0), json!(0)), "{status}");
    (lab, c2)
}

#[test]
fn relay_follow_reports_its_own_destinations_values_under_its_name() {
    let (lab, c2) = two_destinations_one_rewound();
    let follow = |consumer: &str, destination: &str| {
        let base = [
            "relay",
            "--follow",
            "--producer",
            &lab.p,
            "--consumer",
            consumer,
        ];
        Follow::start(&[&base[..], &["--destination", destination]].concat())
    };
    let to_default = follow(&lab.c, "default");
    let exposition = until_exposes(
        &to_default.addr,
        &[
            "ordo_outbox_backlog{destination=\"default\"} 1",
            "ordo_outbox_quarantined{destination=\"default\"} 1",
            "ordo_outbox_rewound{destination=\"default\"} 1",
            "ordo_relay_deliveries_total{destination=\"default\",receipt=\"accepted\"} 0",
            "ordo_relay_errors_total{destination=\"default\",kind=\"connection\"} 0",
        ],
    );
    assert!(
        !exposition.contains("destination=\"audit\""),
        "only its own destination: {exposition}"
    );
    for name in [
        "ordo_outbox_backlog ",
        "ordo_outbox_rewound ",
        "ordo_relay_deliveries_total{receipt",
    ] {
        assert!(
            !has_sample(&exposition, name),
            "{name} unlabelled: {exposition}"
        );
    }
    // A flow begun while it runs reaches default; b-1 stays quarantined.
    lab.advance("d", 0, "reserved", Some(1));
    until_exposes(
        &to_default.addr,
        &[
            "ordo_relay_deliveries_total{destination=\"default\",receipt=\"accepted\"} 1",
            "ordo_outbox_backlog{destination=\"default\"} 1",
        ],
    );
    drop(to_default);

    // audit's relay: its own backlog, which differs, drained to zero.
    let to_audit = follow(&c2, "audit");
    let exposition = until_exposes(
        &to_audit.addr,
        &[
            "ordo_relay_deliveries_total{destination=\"audit\",receipt=\"accepted\"} 4",
            "ordo_outbox_backlog{destination=\"audit\"} 0",
            "ordo_outbox_quarantined{destination=\"audit\"} 0",
            "ordo_outbox_rewound{destination=\"audit\"} 0",
            "ordo_outbox_oldest_pending_age_seconds{destination=\"audit\"} 0",
        ],
    );
    assert!(
        !exposition.contains("destination=\"default\""),
        "{exposition}"
    );
}

#[test]
fn relay_follow_of_a_store_with_one_destination_names_it() {
    let lab = Lab::new();
    lab.init();
    lab.advance("a", 0, "reserved", Some(1));
    lab.advance("b", 0, "reserved", Some(1));
    let relay = Follow::start(&[
        "relay",
        "--follow",
        "--producer",
        &lab.p,
        "--consumer",
        &lab.c,
    ]);
    until_exposes(
        &relay.addr,
        &[
            "ordo_relay_deliveries_total{destination=\"default\",receipt=\"accepted\"} 2",
            "ordo_outbox_backlog{destination=\"default\"} 0",
            "ordo_outbox_rewound{destination=\"default\"} 0",
        ],
    );
}

/// POSTs `envelopes` as one array to the inbox at `serve`; the receipts
/// as `(producer, event_id, receipt)`.
fn post(serve: &Serve, envelopes: &[String]) -> Vec<(String, String, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let body = format!("[{}]", envelopes.join(","));
    let mut response = (agent.post(format!("{}/v1/events", serve.url())))
        .header("content-type", "application/json")
        .send(body.as_bytes())
        .expect("the server answers");
    let text = response.body_mut().read_to_string().unwrap();
    assert_eq!(response.status().as_u16(), 200, "{text}");
    let value: Value = serde_json::from_str(&text).unwrap();
    (value["receipts"].as_array().expect("receipts").iter())
        .map(|r| {
            let field = |key: &str| r[key].as_str().expect("a text field").to_owned();
            (field("producer"), field("event_id"), field("receipt"))
        })
        .collect()
}

/// A reservation envelope of `producer`.
fn of(producer: &str, flow: &str, seq: i64, event_type: &str) -> String {
    let mut value: Value = serde_json::from_str(&reservation(flow, seq, event_type, 3)).unwrap();
    value["producer"] = json!(producer);
    value.to_string()
}

#[test]
fn serve_and_apply_follow_count_each_producers_inbox_apart() {
    let lab = Lab::new();
    ok(&lab, &["init", "--json", "--consumer", &lab.c]);
    let serve = Serve::start(&lab.c, &[]);
    // orders: flow o seq 1 and 2, flow p seq 1. billing: flow o seq 1, flow
    // g at seq 2 (its seq 1 missing), flow x starting with a confirmation.
    let envelopes = [
        of("orders", "o", 1, "reserved"),
        of("orders", "o", 2, "confirmed"),
        of("orders", "p", 1, "reserved"),
        of("billing", "o", 1, "reserved"),
        of("billing", "g", 2, "confirmed"),
        of("billing", "x", 1, "confirmed"),
    ];
    let receipts = post(&serve, &envelopes);
    assert!(
        receipts.iter().all(|(_, _, r)| r == "accepted"),
        "{receipts:?}"
    );
    assert_eq!(post(&serve, &envelopes[..1])[0].2, "duplicate");
    let exposition = until_exposes(
        &serve.addr,
        &[
            "ordo_inbox_pending{producer=\"orders\"} 3",
            "ordo_inbox_pending{producer=\"billing\"} 3",
            "ordo_inbox_gap_flows{producer=\"billing\"} 1",
            "ordo_inbox_gap_flows{producer=\"orders\"} 0",
            "ordo_inbox_blocked{producer=\"billing\"} 0",
            "ordo_inbox_pending{producer=\"default\"} 0",
            "ordo_inbox_received_total{producer=\"orders\",receipt=\"accepted\"} 3",
            "ordo_inbox_received_total{producer=\"orders\",receipt=\"duplicate\"} 1",
            "ordo_inbox_received_total{producer=\"billing\",receipt=\"accepted\"} 3",
        ],
    );
    assert!(
        !has_sample(&exposition, "ordo_inbox_pending "),
        "{exposition}"
    );
    drop(serve);

    // The applier applies orders' flows and billing's o, blocks billing's
    // x, and g waits on its gap.
    let apply = Follow::start(&["apply", "--follow", "--consumer", &lab.c]);
    until_exposes(
        &apply.addr,
        &[
            "ordo_apply_applied_total 4",
            "ordo_inbox_pending{producer=\"orders\"} 0",
            "ordo_inbox_blocked{producer=\"orders\"} 0",
            "ordo_inbox_pending{producer=\"billing\"} 1",
            "ordo_inbox_blocked{producer=\"billing\"} 1",
            "ordo_inbox_gap_flows{producer=\"billing\"} 1",
        ],
    );
}
