//! `ordo soak --effects`: producers, relays, `apply --follow --webhook`
//! appliers and `effects run --follow` executors killed at random against
//! the soak's two providers on loopback, one deduplicating by key and one
//! not; the verdict holds, every intent is accounted for, and the options
//! the effects soak does not take are refused before anything is created.

mod common;

use common::*;

#[test]
fn an_effects_soak_settles_every_intent_against_both_providers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let flows = 40;
    let report = soak_ok(4, flows, 11, &["--effects", "--dir", dir.to_str().unwrap()]);
    assert_eq!(report["events"], u64::from(flows) * 3, "{report}");
    assert_eq!(report["relays"], 2, "{report}");
    for role in ["produce", "relay", "apply", "execute"] {
        assert!(
            report["kills_by_role"][role].as_u64().unwrap_or(0) >= 1,
            "no {role} killed: {report}"
        );
    }
    let effects = &report["effects"];
    let count = |key: &str| effects[key].as_u64().unwrap();
    // One intent per applied event at each of the two consumers.
    assert_eq!(count("intents"), u64::from(flows) * 3 * 2, "{report}");
    assert_eq!(
        count("intents"),
        count("succeeded") + count("outcome_unknown") + count("waiting_behind_unknown"),
        "{report}"
    );
    // The deduplicating provider acted once per event, the plain one at
    // most once per event, once per intent that succeeded there.
    let actions = |side: &str| effects["provider_actions"][side].as_u64().unwrap();
    assert_eq!(actions("dedup"), u64::from(flows) * 3, "{report}");
    assert!(actions("plain") <= u64::from(flows) * 3, "{report}");
    assert!(
        actions("plain") >= count("succeeded") - actions("dedup"),
        "{report}"
    );
    assert_eq!(effects["violations"], serde_json::json!([]), "{report}");
    for file in ["producer.db", "consumer-dedup.db", "consumer-plain.db"] {
        assert!(dir.join(file).exists(), "{file} is not kept in --dir");
    }
    let status = run(&[
        "status",
        "--consumer",
        dir.join("consumer-dedup.db").to_str().unwrap(),
        "--json",
    ])
    .json();
    let succeeded = &status["consumer"]["effects"]["succeeded"];
    assert_eq!(succeeded, u64::from(flows) * 3, "{status}");
}

#[test]
fn an_effects_soak_refuses_what_it_does_not_run_before_anything_is_made() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["--backend", "postgres", "--url", UNREACHABLE_PG],
            "--backend postgres",
        ),
        (&["--topology", "2x2"], "--topology"),
        (&["--transport", "http"], "--transport http"),
        (&["--faults"], "--faults"),
        (&["--relays", "2"], "--relays"),
        (&["--appliers", "9"], "--appliers"),
    ];
    for (extra, needle) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let mut args = vec!["soak", "--effects", "--seconds", "1", "--json"];
        args.extend(["--dir", dir.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let out = run(&args);
        out.usage(needle);
        assert!(!dir.exists(), "{extra:?}: {} was created", dir.display());
    }
}
