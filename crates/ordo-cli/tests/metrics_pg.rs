//! The follow modes' metrics on PostgreSQL: `apply --follow` and
//! `relay --follow` on a real server record the same metrics as on SQLite
//! files, the apply lag included, read from their `/metrics` as a scraper
//! would.

mod common;
mod pgdb;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::process::Process;
use common::{advance_new, http_get, line_reader, run};
use pgdb::Database;
use serde_json::Value;

const PATIENCE: Duration = Duration::from_secs(30);

/// A follow mode with its metrics on any free port; killed when dropped.
struct Follow {
    _child: Process,
    addr: String,
}

impl Follow {
    fn start(args: &[&str]) -> Follow {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
            .args(args)
            .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
            .env_remove("ORDO_CRASH_POINT")
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
            addr,
        }
    }

    /// Reads `/metrics` until every sample is in it (the gauges are read
    /// from the store every second); fails with the last exposition.
    #[track_caller]
    fn until_exposes(&self, samples: &[&str]) {
        let started = Instant::now();
        loop {
            let exposition = http_get(&self.addr, "/metrics");
            let missing: Vec<_> = samples
                .iter()
                .filter(|s| !exposition.contains(*s))
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "{missing:?} missing in {exposition}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn relay_and_apply_follow_on_postgres_serve_their_metrics() {
    let db = Database::create();
    let url = db.url();
    run(&["init", "--producer", &url, "--consumer", &url]).text();
    for flow in ["m-1", "m-2"] {
        advance_new(&url, flow);
    }
    let relay = Follow::start(&["relay", "--follow", "--producer", &url, "--consumer", &url]);
    relay.until_exposes(&[
        "ordo_relay_deliveries_total{destination=\"default\",receipt=\"accepted\"} 2",
        "ordo_outbox_backlog{destination=\"default\"} 0",
        "ordo_outbox_quarantined{destination=\"default\"} 0",
    ]);
    let apply = Follow::start(&["apply", "--follow", "--consumer", &url]);
    apply.until_exposes(&[
        "ordo_apply_applied_total 2",
        "ordo_apply_lag_seconds_count 2",
        "ordo_inbox_pending{producer=\"default\"} 0",
        "ordo_inbox_blocked{producer=\"default\"} 0",
    ]);
    // Work that arrives while both run: relayed, then applied, its lag
    // observed too.
    advance_new(&url, "m-3");
    relay.until_exposes(&[
        "ordo_relay_deliveries_total{destination=\"default\",receipt=\"accepted\"} 3",
    ]);
    apply.until_exposes(&[
        "ordo_apply_applied_total 3",
        "ordo_apply_lag_seconds_count 3",
    ]);
}
