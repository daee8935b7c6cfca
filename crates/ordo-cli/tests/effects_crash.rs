//! The webhook executor's crash matrix (EFFECTS.md "Crash points", "The
//! guarantee, stated honestly"): events applied with `apply --webhook`,
//! `ordo effects run` stopped at each crash point, then run again to the
//! end, against two providers on loopback run by this test: one that
//! deduplicates by `Idempotency-Key`, one that does not. Every clock is
//! fixed (`ORDO_NOW_MS`), so a lease is waited out by moving it on.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use common::{Lab, Out};
use serde_json::{json, Value};

const TIMEOUT_MS: &str = "1000";
const LEASE_MS: i64 = 6000;

/// What a provider saw: every request as `(key, attempt)`, and how many
/// times it acted on each key.
#[derive(Debug, Default)]
struct Seen {
    requests: Vec<(String, u32)>,
    acted: BTreeMap<String, u32>,
}

impl Seen {
    fn requests_of(&self, key: &str) -> usize {
        self.requests.iter().filter(|(k, _)| k == key).count()
    }
}

type Shared = Arc<Mutex<Seen>>;

/// `dedup` acts once per key and answers a repeat as the first; `plain`
/// acts on every request; `flaky` answers 503 to a key's first request
/// (not acting), then acts.
async fn provider_answer(
    State(seen): State<Shared>,
    Path(mode): Path<String>,
    headers: HeaderMap,
) -> Response {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let key = text("idempotency-key").unwrap_or_default().to_owned();
    let attempt: u32 = text("ordo-attempt")
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let mut seen = seen.lock().unwrap();
    let first = seen.requests_of(&key) == 0;
    seen.requests.push((key.clone(), attempt));
    let act = match mode.as_str() {
        "dedup" => !seen.acted.contains_key(&key),
        "flaky" if first => {
            return (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")]).into_response()
        }
        _ => true,
    };
    if act {
        *seen.acted.entry(key.clone()).or_default() += 1;
    }
    axum::Json(json!({"done": key})).into_response()
}

/// A provider on 127.0.0.1 serving `/hooks/{mode}`.
fn provider() -> (SocketAddr, Shared) {
    let seen: Shared = Arc::default();
    let app = Router::new()
        .route("/hooks/{mode}", post(provider_answer))
        .with_state(seen.clone());
    (common::http::serve_on_loopback(app), seen)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Two flows of three events each, relayed and applied with `--webhook
/// URL`: six `webhook` intents, pending.
fn applied(url: &str) -> Lab {
    let lab = Lab::new();
    lab.init();
    for flow in ["f1", "f2"] {
        lab.full_flow(flow, 2);
    }
    lab.relay(&[]);
    lab.apply(&["--webhook", url]);
    assert_eq!(intents(&lab).len(), 6);
    lab
}

/// `ordo effects run --json` at `now_ms`, stopping at `crash` when given.
fn effects_run(lab: &Lab, at_ms: i64, crash: Option<&str>, extra: &[&str]) -> Out {
    let consumer = lab.path("consumer.db");
    let mut command = Command::new(env!("CARGO_BIN_EXE_ordo"));
    command
        .args(["effects", "run", "--json", "--consumer", &consumer])
        .args([
            "--timeout-ms",
            TIMEOUT_MS,
            "--lease-ms",
            &LEASE_MS.to_string(),
        ])
        .args(extra)
        .env("ORDO_NOW_MS", at_ms.to_string())
        .env_remove("ORDO_CRASH_POINT");
    if let Some(point) = crash {
        command.env("ORDO_CRASH_POINT", point);
    }
    let output = command.stdin(Stdio::null()).output().unwrap();
    Out {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// Every intent as `effects list --json` prints it.
fn intents(lab: &Lab) -> Vec<Value> {
    let consumer = lab.path("consumer.db");
    let out = lab.run(&["effects", "list", "--json", "--consumer", &consumer]);
    out.json()["effects"].as_array().unwrap().clone()
}

fn states(intents: &[Value]) -> BTreeMap<String, String> {
    intents
        .iter()
        .map(|i| {
            let key = i["key"].as_str().unwrap().to_owned();
            (key, i["state"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn count(states: &BTreeMap<String, String>, state: &str) -> usize {
    states.values().filter(|s| *s == state).count()
}

/// Runs the executor until every intent is settled or `runs` are done,
/// moving the clock past any lease and backoff each time.
fn run_to_the_end(lab: &Lab, mut at_ms: i64, extra: &[&str], runs: usize) {
    for _ in 0..runs {
        let out = effects_run(lab, at_ms, None, extra);
        let counts = out.json();
        assert!(counts["attempted"].as_u64().is_some(), "{counts}");
        let open = states(&intents(lab))
            .values()
            .any(|s| s == "pending" || s == "in_flight");
        if !open {
            return;
        }
        at_ms += 61_000;
    }
}

#[test]
fn a_deduplicating_provider_acts_once_per_key_whatever_the_crash() {
    let (addr, seen) = provider();
    let prefix = format!("http://{addr}/hooks");
    for point in [
        "effect.after_claim",
        "effect.after_call",
        "effect.after_record",
    ] {
        let lab = applied(&format!("{prefix}/dedup"));
        let extra = ["--allow-url-prefix", &prefix, "--dedup-window", "1h"];
        let t0 = now_ms() + 1_000;
        let crashed = effects_run(&lab, t0, Some(point), &extra);
        assert_eq!(crashed.code, 73, "{point}: {crashed:#?}");
        run_to_the_end(&lab, t0 + LEASE_MS + 1, &extra, 8);
        let states = states(&intents(&lab));
        assert_eq!(count(&states, "succeeded"), 6, "{point}: {states:?}");
        let seen = seen.lock().unwrap();
        for key in states.keys() {
            assert_eq!(seen.acted.get(key), Some(&1), "{point}: {key} acted once");
        }
        if point == "effect.after_call" {
            let resent = states.keys().filter(|k| seen.requests_of(k) == 2).count();
            assert!(
                resent >= 1,
                "the call in progress is sent again under its key"
            );
        }
    }
}

#[test]
fn without_a_dedup_window_an_interrupted_call_ends_unknown_and_is_never_sent_again() {
    let (addr, seen) = provider();
    let prefix = format!("http://{addr}/hooks");
    for point in [
        "effect.after_claim",
        "effect.after_call",
        "effect.after_record",
    ] {
        let lab = applied(&format!("{prefix}/plain"));
        let extra = ["--allow-url-prefix", &prefix];
        let t0 = now_ms() + 1_000;
        let crashed = effects_run(&lab, t0, Some(point), &extra);
        assert_eq!(crashed.code, 73, "{point}: {crashed:#?}");
        run_to_the_end(&lab, t0 + LEASE_MS + 1, &extra, 3);
        // Later runs change nothing: an unknown outcome waits for an operator.
        let settled = states(&intents(&lab));
        effects_run(&lab, t0 + 3_600_000, None, &extra).json();
        assert_eq!(states(&intents(&lab)), settled, "{point}");
        let seen = seen.lock().unwrap();
        for (key, state) in &settled {
            let sent = seen.requests_of(key);
            match state.as_str() {
                "succeeded" => assert_eq!(sent, 1, "{point}: {key}"),
                "outcome_unknown" => assert!(sent <= 1, "{point}: {key} sent again"),
                "pending" => assert_eq!(sent, 0, "{point}: {key} waits behind its flow"),
                other => panic!("{point}: {key} ended {other}"),
            }
        }
        let unknown = count(&settled, "outcome_unknown");
        match point {
            "effect.after_claim" => {
                assert!(unknown >= 1, "{settled:?}");
                let sent: usize = settled.keys().map(|k| seen.requests_of(k)).sum();
                assert_eq!(sent, 0, "nothing claimed before the crash was called");
            }
            "effect.after_call" => {
                assert!(unknown >= 1, "{settled:?}");
                let called_unknown = settled
                    .iter()
                    .filter(|(k, s)| *s == "outcome_unknown" && seen.requests_of(k) == 1);
                assert_eq!(called_unknown.count(), 1, "{settled:?}");
            }
            _ => assert!(count(&settled, "succeeded") >= 1, "{settled:?}"),
        }
    }
}

#[test]
fn sends_after_a_retryable_answer_are_the_only_repeats() {
    let (addr, seen) = provider();
    let prefix = format!("http://{addr}/hooks");
    let lab = applied(&format!("{prefix}/flaky"));
    let extra = ["--allow-url-prefix", &prefix];
    let t0 = now_ms() + 1_000;
    let crashed = effects_run(&lab, t0, Some("effect.after_record"), &extra);
    assert_eq!(crashed.code, 73, "{crashed:#?}");
    run_to_the_end(&lab, t0 + LEASE_MS + 1, &extra, 20);
    let states = states(&intents(&lab));
    let seen = seen.lock().unwrap();
    for (key, state) in &states {
        if state == "succeeded" {
            let attempts: Vec<u32> = seen
                .requests
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, a)| *a)
                .collect();
            assert_eq!(attempts, [1, 2], "{key}: once answered 503, once acted");
            assert_eq!(seen.acted.get(key), Some(&1));
        } else {
            // Claimed beside the call that crashed (never sent, then
            // unknown), or waiting behind it in its flow.
            assert!(
                ["outcome_unknown", "pending"].contains(&state.as_str()),
                "{key}"
            );
            assert_eq!(seen.requests_of(key), 0, "{key}");
        }
    }
    assert!(count(&states, "succeeded") >= 3, "{states:?}");
    assert!(count(&states, "outcome_unknown") <= 1, "{states:?}");
}
