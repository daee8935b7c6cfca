//! `ordo soak --faults`: SIGKILLs and injected I/O errors, full disks and
//! failed syncs in the workers, with the same verdict as without faults; and
//! `--transport http`, where the relays post to an `ordo serve` that is
//! killed as well.

mod common;

use common::*;

#[test]
fn soak_with_faults_keeps_every_invariant() {
    let report = soak_ok(6, 60, 11, &["--faults"]);
    assert!(report["faults_armed"].as_u64().unwrap() > 0, "{report}");
    assert!(report["kills"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["events"], 180, "{report}");
}

#[test]
fn soak_over_http_kills_the_server_too_and_keeps_every_invariant() {
    let report = soak_ok(5, 30, 5, &["--transport", "http"]);
    assert_eq!(report["transport"], "http", "{report}");
    for role in ["produce", "relay", "apply", "server"] {
        assert!(
            report["kills_by_role"][role].as_u64().unwrap_or(0) >= 1,
            "no {role} killed: {report}"
        );
    }
    assert_eq!(report["events"], 90, "{report}");
    assert!(report["violations"].as_array().unwrap().is_empty());
}

#[test]
fn soak_refuses_an_unknown_transport() {
    let out = run(&["soak", "--transport", "carrier-pigeon", "--seconds", "1"]);
    out.usage("--transport");
}

#[test]
fn soak_with_64_producer_threads_loses_no_acknowledged_event() {
    // The verdict includes: every acknowledged event in the outbox, every
    // flow released with each seq once, delivered and applied once.
    let report = soak_ok(5, 200, 5, &["--producer-threads", "64"]);
    assert!(
        report["kills_by_role"]["produce"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert_eq!(report["events"], 600, "{report}");
    assert!(report["acknowledged"].as_u64().unwrap() > 0, "{report}");
}
