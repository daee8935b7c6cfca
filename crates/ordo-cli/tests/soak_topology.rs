//! `ordo soak --topology PxC`: P named producer stores, C consumer stores,
//! one destination per consumer in every producer and one relay per
//! (producer, destination) over HTTP, everything killed at random; the
//! verdict holds for every pair. Bad topologies and the options a topology
//! does not take are refused before anything is created.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::Value;

#[test]
fn a_2x2_soak_brings_every_producer_to_every_consumer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let dir_arg = dir.to_str().unwrap();
    let flows = 40;
    let report = soak_ok(4, flows, 7, &["--topology", "2x2", "--dir", dir_arg]);
    assert_eq!(report["topology"], "2x2", "{report}");
    assert_eq!(report["transport"], "http", "{report}");
    assert_eq!(report["relays"], 4, "{report}");
    let per_producer = u64::from(flows) * 3;
    assert_eq!(report["events"], 2 * per_producer, "{report}");
    for role in ["produce", "relay", "apply", "server"] {
        assert!(
            report["kills_by_role"][role].as_u64().unwrap_or(0) >= 1,
            "no {role} killed: {report}"
        );
    }
    let acknowledged = report["acknowledged"].as_u64().unwrap();
    assert!(
        acknowledged > 0 && acknowledged <= 2 * per_producer,
        "{report}"
    );
    let pairs = report["pairs"].as_array().unwrap();
    let names: BTreeSet<(&str, &str)> = (pairs.iter())
        .map(|p| {
            let name = |key: &str| p[key].as_str().unwrap();
            (name("producer"), name("destination"))
        })
        .collect();
    let expected = [("p1", "c1"), ("p1", "c2"), ("p2", "c1"), ("p2", "c2")];
    assert_eq!(names, BTreeSet::from(expected), "{report}");
    for pair in pairs {
        for key in ["committed", "held", "applied", "effects"] {
            assert_eq!(pair[key], per_producer, "{key} of {pair}");
        }
    }
    stores_are_laid_out_as_reported(&dir, per_producer);
}

/// Each producer store kept in `dir` is named and has exactly one
/// destination per consumer, each bound to its own consumer store; each
/// consumer applied every event of both producers.
fn stores_are_laid_out_as_reported(dir: &std::path::Path, per_producer: u64) {
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let mut consumer_ids = BTreeSet::new();
    for producer in ["p1", "p2"] {
        let file = path(&format!("producer-{producer}.db"));
        let list = run(&["destination", "list", "--producer", &file, "--json"]).json();
        assert_eq!(list["producer_name"], producer, "{list}");
        let destinations = list["destinations"].as_array().unwrap();
        let names: Vec<&str> = (destinations.iter())
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["c1", "c2"], "{list}");
        for d in destinations {
            assert_eq!(
                (&d["backlog"], &d["from"]),
                (&Value::from(0), &Value::from("start"))
            );
            let id = d["consumer_store_id"].as_str().expect("it delivered");
            consumer_ids.insert((d["name"].to_string(), id.to_owned()));
        }
    }
    // Both producers' c1 deliver to one store, and their c2 to another.
    assert_eq!(consumer_ids.len(), 2, "{consumer_ids:?}");
    for consumer in ["c1", "c2"] {
        let file = path(&format!("consumer-{consumer}.db"));
        let status = run(&["status", "--consumer", &file, "--json"]).json();
        assert_eq!(status["consumer"]["applied"], 2 * per_producer, "{status}");
        assert_eq!(status["consumer"]["pending"], 0, "{status}");
    }
}

#[test]
fn a_topology_that_is_not_p_x_c_in_one_to_four_is_refused_before_anything_is_made() {
    for topology in ["0x2", "5x1", "2x5", "2x", "x2", "axb", "2x2x2", "2", "-1x1"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let out = run(&[
            "soak",
            "--topology",
            topology,
            "--seconds",
            "1",
            "--dir",
            dir.to_str().unwrap(),
            "--json",
        ]);
        out.usage("--topology");
        assert!(out.stderr.contains("PxC"), "{topology}: {out:#?}");
        assert!(!dir.exists(), "{topology}: {} was created", dir.display());
    }
}

#[test]
fn a_topology_refuses_postgres_the_file_transport_and_relay_counts() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--backend", "postgres", "--url", UNREACHABLE_PG],
            "--backend postgres",
        ),
        (&["--transport", "file"], "--transport file"),
        (&["--relays", "2"], "--relays"),
    ];
    for (extra, needle) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let mut args = vec!["soak", "--topology", "2x2", "--seconds", "1", "--json"];
        args.extend(["--dir", dir.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let out = run(&args);
        out.usage(needle);
        assert!(out.stderr.contains("--topology 2x2"), "{extra:?}: {out:#?}");
        assert!(!out.stderr.contains("sekret"), "{out:#?}");
        assert!(!dir.exists(), "{extra:?}: {} was created", dir.display());
    }
}
