//! `ordo bench --destinations` as a process: one run per count, every
//! destination's consumer holding and applying every event appended (the
//! bench reads each inbox back and fails otherwise), the relay phase's
//! rates per destination and their ratios to the one destination's, and
//! its refusals of a bad list. Speeds are never asserted.

mod common;

use common::bench;

#[test]
fn every_destination_holds_and_applies_every_event() {
    let args = ["--destinations", "1,2", "--destinations-flows", "30"];
    let v = bench(&[&args[..], &["--batch", "16"]].concat()).json();
    assert_eq!(
        (v["flows"].as_u64(), v["events"].as_u64()),
        (Some(30), Some(90))
    );
    assert!(v["cores"].as_u64().unwrap() >= 1, "{v:#}");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v:#}");
    for (run, n) in runs.iter().zip([1u64, 2]) {
        assert_eq!(run["destinations"], n, "{run:#}");
        assert_eq!(run["events"], 90, "{run:#}");
        assert!(run["events_per_s"].as_f64().unwrap() > 0.0, "{run:#}");
        assert!(run["all_held_seconds"].as_f64().unwrap() > 0.0, "{run:#}");
        let ratio = &run["ratio_to_1"];
        assert!(ratio["all_held_seconds"].as_f64().unwrap() > 0.0, "{run:#}");
        assert!(ratio["events_per_s"].as_f64().unwrap() > 0.0, "{run:#}");
        assert!(
            ratio["relay_events_per_s"].as_f64().unwrap() > 0.0,
            "{run:#}"
        );
        // The relay phase alone, timed after the append.
        for key in [
            "relay_events_per_s",
            "relay_events_per_s_per_destination",
            "ratio_per_destination_to_1",
        ] {
            assert!(run[key].as_f64().unwrap() > 0.0, "{key}: {run:#}");
        }
        // Where the relay threads' time went (Linux says), and so what
        // limits them.
        let limit = run["relay_limit"].as_str().unwrap();
        assert!(["cpu", "cores", "blocked"].contains(&limit), "{run:#}");
        for part in ["cpu_seconds", "runqueue_seconds", "blocked_seconds"] {
            assert!(run["relay_time"][part].as_f64().unwrap() >= 0.0, "{run:#}");
        }
        let per = run["per_destination"].as_array().unwrap();
        assert_eq!(per.len() as u64, n, "{run:#}");
        for d in per {
            assert_eq!(
                (d["held"].as_u64(), d["applied"].as_u64()),
                (Some(90), Some(90)),
                "{run:#}"
            );
            assert!(d["events_per_s"].as_f64().unwrap() > 0.0, "{run:#}");
            assert!(d["relay_events_per_s"].as_f64().unwrap() > 0.0, "{run:#}");
            assert!(d["relay_ratio_to_1"].as_f64().unwrap() > 0.0, "{run:#}");
            assert!(d["relay_time"]["cpu_seconds"].as_f64().is_some(), "{run:#}");
        }
        let names: Vec<&str> = per
            .iter()
            .map(|d| d["destination"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["default", "fanout-02"][..n as usize], "{run:#}");
    }
    assert_eq!(runs[0]["ratio_to_1"]["events_per_s"], 1.0, "{v:#}");
    assert_eq!(runs[0]["ratio_per_destination_to_1"], 1.0, "{v:#}");
    assert_eq!(
        runs[0]["per_destination"][0]["relay_ratio_to_1"], 1.0,
        "{v:#}"
    );
}

#[test]
fn without_a_list_the_counts_are_1_2_4() {
    let v = bench(&["--destinations", "--destinations-flows", "2"]).json();
    let counts: Vec<u64> = (v["runs"].as_array().unwrap().iter())
        .map(|run| run["destinations"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [1, 2, 4], "{v:#}");
}

#[test]
fn a_list_out_of_range_empty_or_twice_is_refused() {
    for (list, needle) in [
        ("0", "1..=16"),
        ("17", "1..=16"),
        ("1,1", "1 is given twice"),
        ("2,4,2", "2 is given twice"),
        ("", "an empty count"),
        ("1,,2", "an empty count"),
    ] {
        bench(&["--destinations", list]).usage(needle);
    }
    bench(&["--destinations", "1", "--producers", "1"]).usage("--producers");
    bench(&["--destinations", "1", "--flows", "10"]).usage("--flows");
    bench(&["--destinations-flows", "10"]).usage("--destinations");
    bench(&["--destinations", "1", "--transport", "http"]).usage("--transport http");
}
