//! Process-level tests of the `ordo` command-line contract
//! (`docs/CLI.md`): the real binary, real SQLite files, exit statuses,
//! stdout JSON and stderr.

mod common;

#[allow(unused_imports)]
use ordo_reservation::ReservationProducer;
use std::path::Path;

use common::{
    advance_args, assert_applied, bytes, envelope, keys, reservation, row, run, run_bytes, sorted,
    Lab,
};
use ordo_core::envelope::FIELDS as ENVELOPE_KEYS;
use serde_json::{json, Value};

const MAX_I64_PLUS_1: &str = "9223372036854775808";

/// The keys of one destination's bookkeeping of an outbox row.
const CUSTODY_KEYS: [&str; 10] = [
    "accepted",
    "accepted_at_ms",
    "attempts",
    "last_outcome",
    "last_error",
    "next_attempt_at_ms",
    "quarantined",
    "quarantine_reason",
    "quarantine_detail",
    "abandoned",
];

// ---------------------------------------------------------------- init

#[test]
fn init_creates_wal_files_and_a_second_init_keeps_all_state() {
    let lab = Lab::new();
    assert_eq!(lab.init(), json!({"producer": lab.p, "consumer": lab.c}));
    for path in [&lab.p, &lab.c] {
        let header = assert_wal(path);
        assert_eq!(&header[..16], b"SQLite format 3\0", "{path}");
    }

    lab.full_flow("A", 4);
    lab.advance("B", 0, "reserved", Some(2));
    lab.relay(&[]);
    lab.apply(&["--flow", "A", "--limit", "2"]);
    let before = lab.snapshot();
    assert_eq!(before["producer"]["flows"].as_array().unwrap().len(), 2);
    assert_eq!(before["consumer"]["effects"].as_array().unwrap().len(), 2);

    assert_eq!(lab.init(), json!({"producer": lab.p, "consumer": lab.c}));
    assert_eq!(lab.snapshot(), before, "a second init reset state");
    for path in [&lab.p, &lab.c] {
        assert_wal(path);
    }
}

/// Asserts that `path` is a SQLite file in WAL mode; its bytes.
#[track_caller]
fn assert_wal(path: &str) -> Vec<u8> {
    let header = bytes(path).expect("init created the file");
    assert!(header.len() >= 100, "{path} has a SQLite header");
    // File format read/write versions 2 and 2 mean WAL.
    assert_eq!(
        (header[18], header[19]),
        (2, 2),
        "{path} is not in WAL mode"
    );
    header
}

#[test]
fn json_flag_is_accepted_anywhere_after_the_command_name() {
    let lab = Lab::new();
    let expected = json!({"producer": lab.p, "consumer": lab.c});
    for args in [
        vec!["init", "--json", "--producer", &lab.p, "--consumer", &lab.c],
        vec!["init", "--producer", &lab.p, "--json", "--consumer", &lab.c],
        vec!["init", "--producer", &lab.p, "--consumer", &lab.c, "--json"],
    ] {
        assert_eq!(run(&args).json(), expected, "{args:?}");
    }
}

#[test]
fn same_file_for_producer_and_consumer_is_refused_before_creating_it() {
    let lab = Lab::new();
    let x = lab.path("x.db");
    let dotted = format!("{}/./x.db", lab.dir.path().display());
    for (p, c) in [(&x, &x), (&x, &dotted)] {
        for cmd in ["init", "snapshot", "relay"] {
            let out = run(&[cmd, "--json", "--producer", p, "--consumer", c]);
            out.usage("--producer");
            assert!(!Path::new(&x).exists(), "{cmd} created {x}");
        }
    }
    // Also when the file already exists.
    lab.init();
    let before = lab.files();
    run(&["init", "--json", "--producer", &lab.p, "--consumer", &lab.p]).usage("--consumer");
    lab.files().assert_unchanged(&before, "invalid input");
}

#[test]
fn a_file_of_the_other_role_is_invalid_input_and_left_alone() {
    let lab = Lab::new();
    lab.full_flow("A", 3);
    lab.relay(&[]);
    let before = lab.files();
    let snapshot = lab.snapshot();

    let mut advance = advance_args(&lab.c, "A", "0", "reserved");
    advance.extend(["--json", "--quantity", "1"]);
    run(&advance).usage("consumer");
    let out = run(&[
        "snapshot",
        "--json",
        "--producer",
        &lab.c,
        "--consumer",
        &lab.p,
    ]);
    assert_eq!(out.code, 2, "{out:#?}");
    assert_eq!(out.stdout, "");
    run_bytes(
        &["receive", "--json", "--consumer", &lab.p],
        reservation("Z", 1, "reserved", 1).as_bytes(),
    )
    .usage("producer");
    run(&["apply", "--json", "--consumer", &lab.p]).usage("producer");

    lab.files()
        .assert_unchanged(&before, "a refused file was written");
    assert_eq!(lab.snapshot(), snapshot);
}

// ---------------------------------------------------------------- storage errors

#[test]
fn storage_errors_exit_1_with_empty_stdout() {
    let lab = Lab::new();
    let text = lab.path("notes.txt");
    let content = "these are notes, not a SQLite database\nsecond line\n".repeat(20);
    std::fs::write(&text, &content).unwrap();
    let missing_dir = lab.path("no-such-dir");
    let inside_missing = format!("{missing_dir}/producer.db");

    for producer in [&text, &inside_missing] {
        let mut advance = advance_args(producer, "A", "0", "reserved");
        advance.extend(["--json", "--quantity", "5"]);
        run(&advance).storage_error();
        let init = run(&[
            "init",
            "--json",
            "--producer",
            producer,
            "--consumer",
            &lab.c,
        ]);
        init.storage_error();
        let snapshot = run(&["snapshot", "--producer", producer, "--consumer", &lab.c]);
        snapshot.storage_error();
    }
    let receive = run_bytes(
        &["receive", "--json", "--consumer", &text],
        reservation("A", 1, "reserved", 5).as_bytes(),
    );
    receive.storage_error();
    run(&["apply", "--json", "--consumer", &inside_missing]).storage_error();

    assert_eq!(std::fs::read_to_string(&text).unwrap(), content);
    assert!(
        !Path::new(&missing_dir).exists(),
        "the missing directory was created"
    );
}

// ---------------------------------------------------------------- advance

#[test]
fn advance_json_shapes_and_outcomes() {
    let lab = Lab::new();
    let committed = lab.advance("A", 0, "reserved", Some(5));
    assert_eq!(
        committed,
        json!({"outcome": "committed", "event": {
            "event_id": "A-1", "flow_id": "A", "seq": 1, "schema_version": 1,
            "type": "reserved", "payload": {"amount": 5}
        }})
    );

    // stale is checked first, then invalid_transition, then the quantity.
    assert_eq!(
        lab.advance("A", 0, "reserved", Some(5)),
        json!({"outcome": "stale", "last_seq": 1})
    );
    assert_eq!(
        lab.advance("A", 0, "released", Some(99)),
        json!({"outcome": "stale", "last_seq": 1})
    );
    assert_eq!(
        lab.advance_out("A", 9_223_372_036_854_775_807, "confirmed", None, None)
            .json(),
        json!({"outcome": "stale", "last_seq": 1})
    );
    assert_eq!(
        lab.advance("A", 1, "reserved", Some(5)),
        json!({"outcome": "invalid_transition", "from": "reserved", "to": "reserved"})
    );
    assert_eq!(
        lab.advance("A", 1, "released", Some(99)),
        json!({"outcome": "invalid_transition", "from": "reserved", "to": "released"})
    );
    assert_eq!(
        lab.advance("N", 0, "confirmed", None),
        json!({"outcome": "invalid_transition", "from": "new", "to": "confirmed"})
    );

    // Later steps default to the flow's quantity, or repeat it.
    assert_eq!(
        lab.advance("A", 1, "confirmed", None),
        json!({"outcome": "committed", "event": {
            "event_id": "A-2", "flow_id": "A", "seq": 2, "schema_version": 1,
            "type": "confirmed", "payload": {"amount": 5}
        }})
    );
    assert_eq!(
        lab.advance("A", 2, "released", Some(5)),
        json!({"outcome": "committed", "event": {
            "event_id": "A-3", "flow_id": "A", "seq": 3, "schema_version": 1,
            "type": "released", "payload": {"amount": 5}
        }})
    );
    assert_eq!(
        lab.advance("A", 3, "released", None),
        json!({"outcome": "invalid_transition", "from": "released", "to": "released"})
    );

    // Schema 2 payload, and the quantity bounds.
    assert_eq!(
        lab.advance_out("B", 0, "reserved", Some(1_000_000), Some(2))
            .json(),
        json!({"outcome": "committed", "event": {
            "event_id": "B-1", "flow_id": "B", "seq": 1, "schema_version": 2,
            "type": "reserved", "payload": {"units": 1_000_000}
        }})
    );
    assert_eq!(
        lab.advance_out("B", 1, "confirmed", None, Some(2)).json()["event"]["payload"],
        json!({"units": 1_000_000})
    );
    let long = "f".repeat(100);
    assert_eq!(
        lab.advance(&long, 0, "reserved", Some(1))["event"]["flow_id"],
        json!(long)
    );

    let snapshot = lab.snapshot();
    assert_eq!(
        row(&snapshot["producer"]["flows"], "flow_id", "A"),
        &json!({"flow_id": "A", "state": "released", "quantity": 5, "last_seq": 3})
    );
    assert_eq!(
        row(&snapshot["producer"]["flows"], "flow_id", "B"),
        &json!({"flow_id": "B", "state": "confirmed", "quantity": 1_000_000, "last_seq": 2})
    );
    // Outcomes other than committed are not recorded: N never advanced.
    assert!(snapshot["producer"]["outbox"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["flow_id"] != "N"));
    assert_eq!(snapshot["producer"]["outbox"].as_array().unwrap().len(), 6);
}

#[test]
fn advance_quantity_different_from_the_flows_is_invalid_input_and_changes_nothing() {
    let lab = Lab::new();
    lab.advance("A", 0, "reserved", Some(5));
    let snapshot = lab.snapshot();
    let before = lab.files();
    for q in [4, 6, 1_000_000] {
        lab.advance_out("A", 1, "confirmed", Some(q), None)
            .usage("--quantity");
    }
    lab.files().assert_unchanged(&before, "invalid input");
    assert_eq!(lab.snapshot(), snapshot);
    assert_eq!(
        row(&snapshot["producer"]["flows"], "flow_id", "A"),
        &json!({"flow_id": "A", "state": "reserved", "quantity": 5, "last_seq": 1})
    );
    // The right quantity still commits.
    assert_eq!(
        lab.advance("A", 1, "confirmed", Some(5))["outcome"],
        "committed"
    );
}

/// Every invalid-argument case of `advance`, with the flag its message names.
fn bad_advance_cases() -> Vec<(Vec<String>, &'static str)> {
    let base = |flow: &str, seq: &str, to: &str, extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["--flow", flow, "--expected-seq", seq, "--to", to]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let long = "a".repeat(101);
    vec![
        (base(&long, "0", "reserved", &["--quantity", "1"]), "--flow"),
        (base("", "0", "reserved", &["--quantity", "1"]), "--flow"),
        (
            base("flöw", "0", "reserved", &["--quantity", "1"]),
            "--flow",
        ),
        (base("a.b", "0", "reserved", &["--quantity", "1"]), "--flow"),
        (base("a b", "0", "reserved", &["--quantity", "1"]), "--flow"),
        (
            base("A", "0", "reserved", &["--quantity", "0"]),
            "--quantity",
        ),
        (
            base("A", "0", "reserved", &["--quantity", "1000001"]),
            "--quantity",
        ),
        (
            base("A", "0", "reserved", &["--quantity", "1.5"]),
            "--quantity",
        ),
        (
            base("A", "0", "reserved", &["--quantity", "x"]),
            "--quantity",
        ),
        (
            base("A", "0", "reserved", &["--quantity", "-3"]),
            "--quantity",
        ),
        (base("A", "0", "reserved", &[]), "--quantity"),
        (
            base("A", "-1", "reserved", &["--quantity", "1"]),
            "--expected-seq",
        ),
        (
            base("A", MAX_I64_PLUS_1, "reserved", &["--quantity", "1"]),
            "--expected-seq",
        ),
        (
            base("A", "1.0", "reserved", &["--quantity", "1"]),
            "--expected-seq",
        ),
        (
            base("A", "", "reserved", &["--quantity", "1"]),
            "--expected-seq",
        ),
        (base("A", "0", "new", &["--quantity", "1"]), "--to"),
        (base("A", "0", "bogus", &["--quantity", "1"]), "--to"),
        (base("A", "0", "Reserved", &["--quantity", "1"]), "--to"),
        (
            base("A", "0", "reserved", &["--quantity", "1", "--schema", "3"]),
            "--schema",
        ),
        (
            base("A", "0", "reserved", &["--quantity", "1", "--schema", "0"]),
            "--schema",
        ),
        (
            base("A", "0", "reserved", &["--quantity", "1", "--bogus"]),
            "--bogus",
        ),
        (
            base(
                "A",
                "0",
                "reserved",
                &["--quantity", "1", "--quantity", "2"],
            ),
            "--quantity",
        ),
        (
            ["--flow", "A", "--to", "reserved", "--quantity", "1"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            "--expected-seq",
        ),
    ]
}

#[test]
fn advance_invalid_arguments_exit_2_and_write_nothing() {
    let fresh = Lab::new();
    let used = Lab::new();
    used.advance("A", 0, "reserved", Some(7));
    let before = used.files();
    for (args, needle) in bad_advance_cases() {
        for lab in [&fresh, &used] {
            for json_flag in [true, false] {
                let mut full: Vec<&str> = vec!["advance", "--producer", &lab.p];
                if json_flag {
                    full.push("--json");
                }
                full.extend(args.iter().map(String::as_str));
                let out = run(&full);
                out.usage(needle);
            }
        }
        fresh.assert_no_files();
        used.files().assert_unchanged(&before, &format!("{args:?}"));
    }
}

#[test]
fn unknown_commands_and_missing_flags_are_usage_errors() {
    let lab = Lab::new();
    run(&["bogus"]).usage("bogus");
    // one side or both, but at least one
    run(&["init"]).usage("--producer");
    run(&["snapshot"]).usage("--producer");
    run(&[
        "init",
        "--producer",
        &lab.p,
        "--consumer",
        &lab.c,
        "--frobnicate",
    ])
    .usage("--frobnicate");
    run(&["receive", "--json"]).usage("--consumer");
    run(&["status", "--json"]).usage("--producer");
    run(&["prune", "--older-than", "1d"]).usage("--producer");
    run(&["status", "--consumer", &lab.c, "--max-backlog", "1"])
        .usage("--max-backlog needs --producer");
    run(&["status", "--producer", &lab.p, "--max-blocked", "1"])
        .usage("--max-blocked needs --consumer");
    lab.assert_no_files();
}

#[test]
fn no_command_at_all_is_a_one_line_usage_error() {
    run(&[]).usage("init");
    run(&["--json"]).usage("advance");
    run(&["advance"]).usage("--producer");
}

// ---------------------------------------------------------------- receive

#[test]
fn receive_one_object_spanning_several_lines() {
    let lab = Lab::new();
    let input = "{\n  \"event_id\": \"A-1\",\n  \"flow_id\": \"A\",\n  \"seq\": 1,\n  \
                 \"schema_version\": 1,\n  \"type\": \"reserved\",\n  \"payload\": {\n    \
                 \"amount\": 5\n  }\n}\n";
    assert_eq!(
        lab.receive(input),
        json!({"receipts": [receipt("A-1", "A", 1, "accepted")]})
    );
    let snapshot = lab.snapshot();
    assert_eq!(
        snapshot["consumer"]["inbox"],
        json!([{
            "event_id": "A-1", "flow_id": "A", "seq": 1, "schema_version": 1,
            "type": "reserved", "payload": {"amount": 5},
            "status": "pending", "reason": null, "detail": null,
            "producer": "default", "store_id": null
        }])
    );
    // receive never touches the projection or the effects.
    assert_applied(&snapshot, json!([]), &[]);
}

#[test]
fn receive_one_object_per_line_in_input_order_with_blank_lines() {
    let lab = Lab::new();
    let input = format!(
        "\n{}\n\n   \n{}\n{}\n\n{}\n",
        reservation("A", 3, "released", 5),
        reservation("A", 1, "reserved", 5),
        reservation("B", 1, "reserved", 2),
        reservation("A", 2, "confirmed", 5),
    );
    assert_eq!(
        lab.receive(&input),
        json!({"receipts": [
            receipt("A-3", "A", 3, "accepted"),
            receipt("A-1", "A", 1, "accepted"),
            receipt("B-1", "B", 1, "accepted"),
            receipt("A-2", "A", 2, "accepted"),
        ]})
    );
    // The same envelope twice in one input: accepted, then duplicate.
    let twice = format!(
        "{}\n{}\n",
        reservation("C", 1, "reserved", 1),
        reservation("C", 1, "reserved", 1)
    );
    assert_eq!(
        lab.receive(&twice),
        json!({"receipts": [
            receipt("C-1", "C", 1, "accepted"),
            receipt("C-1", "C", 1, "duplicate"),
        ]})
    );
    assert_eq!(
        lab.snapshot()["consumer"]["inbox"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
}

#[test]
fn receive_empty_input_prints_no_receipts() {
    let lab = Lab::new();
    for input in ["", "\n", "\n\n   \n\t\n"] {
        assert_eq!(lab.receive(input), json!({"receipts": []}), "{input:?}");
    }
    assert_eq!(lab.snapshot()["consumer"]["inbox"], json!([]));
}

#[test]
fn receive_malformed_line_in_a_batch_stores_nothing() {
    let lab = Lab::new();
    let input = format!(
        "{}\n{}\n{{\"event_id\": oops\n{}\n",
        reservation("A", 1, "reserved", 5),
        reservation("B", 1, "reserved", 5),
        reservation("C", 1, "reserved", 5),
    );
    lab.receive_out(input.as_bytes()).usage("line 3");
    lab.assert_no_files();

    // A shell error (not a JSON error) in the middle of a valid stream.
    let bad_field = format!(
        "{}\n{}\n{}\n",
        reservation("A", 1, "reserved", 5),
        envelope("B-1", "B", 0, 1, "reserved", json!({"amount": 5})),
        reservation("C", 1, "reserved", 5),
    );
    lab.receive_out(bad_field.as_bytes()).usage("seq");
    lab.assert_no_files();

    lab.init();
    let before = lab.files();
    lab.receive_out(input.as_bytes()).usage("line 3");
    lab.receive_out(bad_field.as_bytes()).usage("seq");
    lab.files().assert_unchanged(&before, "invalid input");
    assert_eq!(lab.snapshot()["consumer"]["inbox"], json!([]));
}

/// Regression: `{..} {..}` on one line was received as two envelopes; a
/// stream is one object (which may span lines) or one object per line.
#[test]
fn two_envelopes_on_one_line_are_malformed() {
    let lab = Lab::new();
    let (a, b) = (
        reservation("A", 1, "reserved", 5),
        reservation("B", 1, "reserved", 5),
    );
    let input = format!("{a}\n{a} {b}\n");
    let needle =
        "stdin line 2: malformed envelope: envelope 3 starts on the line where envelope 2 ends";
    lab.receive_out(input.as_bytes()).usage(needle);
    lab.assert_no_files();

    lab.init();
    let before = lab.files();
    lab.receive_out(format!("{a}{b}").as_bytes())
        .usage("stdin line 1: malformed envelope: envelope 2 starts");
    lab.receive_out(input.as_bytes()).usage(needle);
    lab.files()
        .assert_unchanged(&before, "two envelopes on one line");
    assert_eq!(lab.snapshot()["consumer"]["inbox"], json!([]));

    // The same envelopes one per line are received.
    assert_eq!(
        lab.receive(&format!("{a}\n{b}\n")),
        json!({"receipts": [
            receipt("A-1", "A", 1, "accepted"),
            receipt("B-1", "B", 1, "accepted"),
        ]})
    );
}

/// Malformed inputs for `receive`, each with a word its message must contain.
fn malformed_envelopes() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let good = |field: &str, raw: &str| -> Vec<u8> {
        let mut fields = [
            ("event_id", "\"E-1\"".to_string()),
            ("flow_id", "\"E\"".to_string()),
            ("seq", "1".to_string()),
            ("schema_version", "1".to_string()),
            ("type", "\"reserved\"".to_string()),
            ("payload", "{\"amount\":5}".to_string()),
        ];
        for (name, value) in fields.iter_mut() {
            if *name == field {
                *value = raw.to_string();
            }
        }
        let body: Vec<String> = fields
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| format!("\"{name}\":{value}"))
            .collect();
        format!("{{{}}}", body.join(",")).into_bytes()
    };
    let valid = String::from_utf8(good("", "")).unwrap();
    let mut invalid_utf8 =
        br#"{"event_id":"E-1","flow_id":"E","seq":1,"schema_version":1,"type":"reserv"#.to_vec();
    invalid_utf8.extend_from_slice(b"\xff\xfe");
    invalid_utf8.extend_from_slice(br#"ed","payload":{"amount":5}}"#);
    let long_id = format!("\"{}\"", "e".repeat(101));
    let long_type = format!("\"{}\"", "t".repeat(101));
    vec![
        ("not JSON", b"hello world".to_vec(), "line 1"),
        (
            "truncated",
            br#"{"event_id":"E-1","flow_id":"#.to_vec(),
            "line 1",
        ),
        ("invalid UTF-8", invalid_utf8, "UTF-8"),
        ("NaN seq", good("seq", "NaN"), "line 1"),
        (
            "Infinity in payload",
            good("payload", "{\"amount\":Infinity}"),
            "line 1",
        ),
        (
            "-Infinity in payload",
            good("payload", "{\"amount\":-Infinity}"),
            "line 1",
        ),
        (
            "number out of double range",
            good("payload", "{\"amount\":1e400}"),
            "line 1",
        ),
        (
            "repeated top-level key",
            format!("{{\"seq\":1,{}", &valid[1..]).into_bytes(),
            "seq",
        ),
        (
            "repeated key in payload",
            good("payload", "{\"amount\":5,\"amount\":5}"),
            "amount",
        ),
        (
            "repeated key deep in payload",
            good("payload", "{\"x\":{\"k\":1,\"k\":2}}"),
            "\"k\"",
        ),
        ("array", format!("[{valid}]").into_bytes(), "object"),
        ("string", b"\"an envelope\"".to_vec(), "object"),
        ("number", b"42".to_vec(), "object"),
        ("null", b"null".to_vec(), "object"),
        ("missing payload", good("payload", ""), "payload"),
        ("missing seq", good("seq", ""), "seq"),
        ("missing event_id", good("event_id", ""), "event_id"),
        (
            "extra field",
            format!("{{\"extra\":1,{}", &valid[1..]).into_bytes(),
            "extra",
        ),
        ("seq 0", good("seq", "0"), "seq"),
        ("seq -1", good("seq", "-1"), "seq"),
        ("seq 1.0", good("seq", "1.0"), "seq"),
        ("seq 1e0", good("seq", "1e0"), "seq"),
        ("seq \"1\"", good("seq", "\"1\""), "seq"),
        ("seq null", good("seq", "null"), "seq"),
        ("seq i64::MAX + 1", good("seq", MAX_I64_PLUS_1), "seq"),
        ("event_id 101 chars", good("event_id", &long_id), "event_id"),
        ("event_id empty", good("event_id", "\"\""), "event_id"),
        (
            "event_id with a dot",
            good("event_id", "\"a.b\""),
            "event_id",
        ),
        ("event_id a number", good("event_id", "7"), "event_id"),
        ("flow_id non-ASCII", good("flow_id", "\"flöw\""), "flow_id"),
        ("flow_id empty", good("flow_id", "\"\""), "flow_id"),
        ("type empty", good("type", "\"\""), "type"),
        ("type 101 bytes", good("type", &long_type), "type"),
        ("type not a string", good("type", "1"), "type"),
        ("payload an array", good("payload", "[5]"), "payload"),
        ("payload a string", good("payload", "\"5\""), "payload"),
        ("payload null", good("payload", "null"), "payload"),
        (
            "schema_version 0",
            good("schema_version", "0"),
            "schema_version",
        ),
        (
            "schema_version \"1\"",
            good("schema_version", "\"1\""),
            "schema_version",
        ),
        (
            "schema_version 1.5",
            good("schema_version", "1.5"),
            "schema_version",
        ),
        (
            "trailing garbage",
            format!("{valid} trailing").into_bytes(),
            "line 1",
        ),
    ]
}

#[test]
fn receive_malformed_envelopes_exit_2_and_store_nothing() {
    let cases = malformed_envelopes();
    assert!(cases.len() >= 15);
    let fresh = Lab::new();
    let used = Lab::new();
    used.receive(&reservation("U", 1, "reserved", 3));
    let before = used.files();
    for (name, input, needle) in &cases {
        let out = fresh.receive_out(input);
        assert_eq!(out.code, 2, "{name}: {out:#?}");
        out.usage(needle);
        fresh.assert_no_files();

        // The same, after a valid envelope in the same input.
        let mut batch = reservation("V", 1, "reserved", 3).into_bytes();
        batch.push(b'\n');
        batch.extend_from_slice(input);
        let out = used.receive_out(&batch);
        assert_eq!(out.code, 2, "{name} (in a batch): {out:#?}");
        out.usage(&needle.replace("line 1", "line 2"));
        used.files().assert_unchanged(&before, name);
    }
    // Without --json the contract is the same.
    let out = run_bytes(&["receive", "--consumer", &fresh.c], b"[]");
    out.usage("object");
    fresh.assert_no_files();
    let inbox = used.snapshot()["consumer"]["inbox"].clone();
    assert_eq!(inbox.as_array().unwrap().len(), 1, "{inbox}");
}

/// `receive`'s receipt of an envelope of the default producer (CLI.md).
fn receipt(event_id: &str, flow_id: &str, seq: i64, receipt: &str) -> Value {
    json!({"event_id": event_id, "flow_id": flow_id, "seq": seq, "producer": "default", "receipt": receipt})
}

/// `receive`'s `conflict` receipt: its cause and the held event.
fn conflict(event_id: &str, flow_id: &str, seq: i64, cause: &str, held: Option<&str>) -> Value {
    let mut value = receipt(event_id, flow_id, seq, "conflict");
    value["cause"] = json!(cause);
    value["held_event_id"] = json!(held);
    value
}

/// Envelopes at the upper bounds of every field.
fn bound_envelopes() -> (String, String) {
    let id100 = "i".repeat(100);
    let type100 = "t".repeat(100);
    let input = format!(
        "{}\n{}\n",
        envelope("M-1", "M", i64::MAX, 1, "reserved", json!({"amount": 5})),
        envelope(&id100, &id100, 1, i64::MAX, &type100, json!({})),
    );
    (input, id100)
}

#[test]
fn receive_accepts_the_bounds() {
    let lab = Lab::new();
    let (input, id100) = bound_envelopes();
    assert_eq!(
        lab.receive(&input),
        json!({"receipts": [
            receipt("M-1", "M", i64::MAX, "accepted"),
            receipt(&id100, &id100, 1, "accepted"),
        ]})
    );
    assert_eq!(
        lab.receive(&input),
        json!({"receipts": [
            receipt("M-1", "M", i64::MAX, "duplicate"),
            receipt(&id100, &id100, 1, "duplicate"),
        ]})
    );
}

/// Regression: the stored body once was the RFC 8785 form, which writes every
/// number as an IEEE double, so `seq` 9223372036854775807 came back as
/// 9223372036854776000 and the row could no longer be read.
#[test]
fn received_bounds_round_trip_through_the_inbox() {
    let lab = Lab::new();
    let (input, id100) = bound_envelopes();
    lab.receive(&input);
    let inbox = &lab.snapshot()["consumer"]["inbox"];
    assert_eq!(row(inbox, "event_id", "M-1")["seq"], json!(i64::MAX));
    assert_eq!(
        row(inbox, "event_id", &id100)["schema_version"],
        json!(i64::MAX)
    );
    assert_eq!(
        lab.apply(&["--flow", "M"]),
        json!({"flows": [{"flow_id": "M", "producer": "default", "applied": 0, "stop": "gap", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );
}

#[test]
fn receive_duplicate_ignores_key_order_and_number_spelling() {
    let lab = Lab::new();
    let original = r#"{"event_id":"A-1","flow_id":"A","seq":1,"schema_version":1,"type":"reserved","payload":{"amount":5,"note":{"x":1,"y":2}}}"#;
    let reordered = r#"{"payload":{"note":{"y":2.0,"x":1},"amount":5.0},"type":"reserved","schema_version":1,"seq":1,"flow_id":"A","event_id":"A-1"}"#;
    assert_eq!(
        lab.receive(original),
        json!({"receipts": [receipt("A-1", "A", 1, "accepted")]})
    );
    let snapshot = lab.snapshot();
    assert_eq!(
        lab.receive(reordered),
        json!({"receipts": [receipt("A-1", "A", 1, "duplicate")]})
    );
    assert_eq!(
        lab.receive(&format!("{original}\n{reordered}\n")),
        json!({"receipts": [
            receipt("A-1", "A", 1, "duplicate"),
            receipt("A-1", "A", 1, "duplicate"),
        ]})
    );
    assert_eq!(lab.snapshot(), snapshot);
}

#[test]
fn receive_conflicts_exit_0_and_change_nothing() {
    let lab = Lab::new();
    lab.receive(&reservation("A", 1, "reserved", 5));
    let snapshot = lab.snapshot();
    let same_id_other_body = envelope("A-1", "A", 1, 1, "reserved", json!({"amount": 6}));
    let same_seq_other_id = envelope("other", "A", 1, 1, "reserved", json!({"amount": 5}));
    let same_id_other_flow = envelope("A-1", "B", 1, 1, "reserved", json!({"amount": 5}));
    for input in [&same_id_other_body, &same_seq_other_id, &same_id_other_flow] {
        let out = lab.receive_out(input.as_bytes());
        let sent = serde_json::from_str::<Value>(input).unwrap();
        let text = |key: &str| sent[key].as_str().unwrap().to_owned();
        let seq = sent["seq"].as_i64().unwrap();
        let held = conflict(
            &text("event_id"),
            &text("flow_id"),
            seq,
            "conflict",
            Some("A-1"),
        );
        assert_eq!(out.json(), json!({"receipts": [held]}));
        assert_eq!(lab.snapshot(), snapshot, "a conflict changed the inbox");
    }
    // Mixed with new envelopes: receipts in input order; nothing of flow A
    // after its conflict is stored, even its next event or a duplicate;
    // flow B goes on.
    let mixed = format!(
        "{same_seq_other_id}\n{}\n{}\n{}\n",
        reservation("A", 2, "confirmed", 5),
        reservation("B", 1, "reserved", 5),
        reservation("A", 1, "reserved", 5)
    );
    assert_eq!(
        lab.receive(&mixed),
        json!({"receipts": [
            conflict("other", "A", 1, "conflict", Some("A-1")),
            conflict("A-2", "A", 2, "after_conflict", None),
            receipt("B-1", "B", 1, "accepted"),
            conflict("A-1", "A", 1, "after_conflict", None),
        ]})
    );
    let inbox = lab.snapshot()["consumer"]["inbox"].clone();
    assert_eq!(inbox.as_array().unwrap().len(), 2);
    assert!(row(&inbox, "event_id", "B-1").is_object());
    assert_eq!(
        row(&inbox, "event_id", "A-1")["payload"],
        json!({"amount": 5})
    );
}

// ---------------------------------------------------------------- relay

#[test]
fn relay_json_shape_max_and_drained() {
    let lab = Lab::new();
    lab.advance("A", 0, "reserved", Some(5));
    lab.advance("B", 0, "reserved", Some(2));
    lab.advance("A", 1, "confirmed", None);
    lab.advance("B", 1, "confirmed", None);
    lab.advance("A", 2, "released", None);

    assert_eq!(
        lab.relay(&["--max", "2", "--policy", "first-pending"]),
        json!({"deliveries": [
            {"event_id": "A-1", "flow_id": "A", "seq": 1, "receipt": "accepted"},
            {"event_id": "B-1", "flow_id": "B", "seq": 1, "receipt": "accepted"},
        ], "stop": "max", "deliveries_total": 2, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    assert_eq!(
        lab.relay(&["--max", "1", "--policy", "first-pending"]),
        json!({"deliveries": [
            {"event_id": "A-2", "flow_id": "A", "seq": 2, "receipt": "accepted"},
        ], "stop": "max", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    assert_eq!(
        lab.relay(&["--policy", "first-pending"]),
        json!({"deliveries": [
            {"event_id": "B-2", "flow_id": "B", "seq": 2, "receipt": "accepted"},
            {"event_id": "A-3", "flow_id": "A", "seq": 3, "receipt": "accepted"},
        ], "stop": "drained", "deliveries_total": 2, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    assert_eq!(
        lab.relay(&[]),
        json!({"deliveries": [], "stop": "drained", "deliveries_total": 0, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    let snapshot = lab.snapshot();
    let outbox = snapshot["producer"]["outbox"].as_array().unwrap();
    assert_eq!(outbox.len(), 5);
    assert!(
        outbox.iter().all(|e| e["accepted"] == json!(true)),
        "{outbox:?}"
    );
    assert_eq!(snapshot["consumer"]["inbox"].as_array().unwrap().len(), 5);

    // --event on an accepted event: duplicate, nothing else delivered.
    assert_eq!(
        lab.relay(&["--event", "A-2"]),
        json!({"deliveries": [
            {"event_id": "A-2", "flow_id": "A", "seq": 2, "receipt": "duplicate"},
        ], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    // Only A-2's bookkeeping moved: one more attempt, answered duplicate.
    let mut expected = snapshot;
    let a2 = (expected["producer"]["outbox"]
        .as_array_mut()
        .unwrap()
        .iter_mut())
    .find(|e| e["event_id"] == "A-2")
    .unwrap();
    a2["destinations"]["default"]["attempts"] = json!(2);
    a2["destinations"]["default"]["last_outcome"] = json!("duplicate");
    assert_eq!(lab.snapshot(), expected);
}

#[test]
fn relay_event_ignores_max_and_policy() {
    let lab = Lab::new();
    lab.advance("A", 0, "reserved", Some(5));
    lab.advance("B", 0, "reserved", Some(5));
    assert_eq!(
        lab.relay(&["--event", "B-1", "--max", "1", "--policy", "first-pending"]),
        json!({"deliveries": [
            {"event_id": "B-1", "flow_id": "B", "seq": 1, "receipt": "accepted"},
        ], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    let outbox = lab.snapshot()["producer"]["outbox"].clone();
    assert_eq!(row(&outbox, "event_id", "A-1")["accepted"], json!(false));
    assert_eq!(row(&outbox, "event_id", "B-1")["accepted"], json!(true));
}

#[test]
fn relay_invalid_arguments_exit_2_and_create_nothing() {
    let lab = Lab::new();
    lab.relay_out(&["--event", "nope"]).usage("nope");
    lab.assert_no_files();
    lab.relay_out(&["--max", "0"]).usage("--max");
    lab.relay_out(&["--max", "-1"]).usage("--max");
    lab.relay_out(&["--max", "x"]).usage("--max");
    lab.relay_out(&["--policy", "bogus"]).usage("--policy");
    lab.relay_out(&["--event", "a.b"]).usage("--event");
    lab.relay_out(&["--event", ""]).usage("--event");
    lab.assert_no_files();

    // Only the producer exists: an unknown event must not create the consumer.
    lab.advance("A", 0, "reserved", Some(5));
    let producer = bytes(&lab.p);
    lab.relay_out(&["--event", "A-2"]).usage("A-2");
    assert!(
        !Path::new(&lab.c).exists(),
        "relay --event with an unknown id created the consumer file"
    );
    assert_eq!(bytes(&lab.p), producer);

    // Both exist: nothing changes.
    lab.init();
    let before = lab.files();
    lab.relay_out(&["--event", "A-2"]).usage("A-2");
    lab.relay_out(&["--max", "0"]).usage("--max");
    lab.files().assert_unchanged(&before, "invalid input");
    let outbox = lab.snapshot()["producer"]["outbox"].clone();
    assert_eq!(row(&outbox, "event_id", "A-1")["accepted"], json!(false));
}

#[test]
fn first_pending_conflict_starves_later_flows_until_explicit_delivery() {
    let lab = Lab::new();
    lab.advance("A", 0, "reserved", Some(5));
    lab.advance("B", 0, "reserved", Some(3));
    // The consumer already holds a different body under A-1.
    let impostor = envelope("A-1", "A", 1, 1, "reserved", json!({"amount": 999}));
    assert_eq!(
        lab.receive(&impostor),
        json!({"receipts": [receipt("A-1", "A", 1, "accepted")]})
    );

    for _ in 0..3 {
        assert_eq!(
            lab.relay(&["--policy", "first-pending"]),
            json!({"deliveries": [
                {"event_id": "A-1", "flow_id": "A", "seq": 1, "receipt": "conflict", "cause": "conflict"},
            ], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
        );
    }
    let snapshot = lab.snapshot();
    assert_eq!(snapshot["consumer"]["inbox"].as_array().unwrap().len(), 1);
    assert!(snapshot["producer"]["outbox"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["accepted"] == json!(false)));

    assert_eq!(
        lab.relay(&["--event", "B-1"]),
        json!({"deliveries": [
            {"event_id": "B-1", "flow_id": "B", "seq": 1, "receipt": "accepted"},
        ], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    let snapshot = lab.snapshot();
    let outbox = &snapshot["producer"]["outbox"];
    assert_eq!(row(outbox, "event_id", "A-1")["accepted"], json!(false));
    assert_eq!(row(outbox, "event_id", "B-1")["accepted"], json!(true));
    let inbox = &snapshot["consumer"]["inbox"];
    assert_eq!(inbox.as_array().unwrap().len(), 2);
    assert_eq!(
        row(inbox, "event_id", "A-1")["payload"],
        json!({"amount": 999})
    );
    assert_eq!(row(inbox, "event_id", "B-1")["status"], "pending");

    // Still starved: the next run again stops on A-1's conflict.
    assert_eq!(
        lab.relay(&["--policy", "first-pending"])["deliveries"],
        json!([{"event_id": "A-1", "flow_id": "A", "seq": 1, "receipt": "conflict", "cause": "conflict"}])
    );
}

// ---------------------------------------------------------------- apply

#[test]
fn apply_stops_limit_gap_blocked_idle() {
    let lab = Lab::new();
    lab.full_flow("A", 4);
    lab.relay(&[]);

    assert_eq!(
        lab.apply(&["--flow", "A", "--limit", "2"]),
        json!({"flows": [{"flow_id": "A", "producer": "default", "applied": 2, "stop": "limit", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );
    assert_eq!(
        lab.apply(&["--flow", "A"]),
        json!({"flows": [{"flow_id": "A", "producer": "default", "applied": 1, "stop": "idle", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );
    assert_eq!(
        lab.apply(&["--flow", "A"]),
        json!({"flows": [{"flow_id": "A", "producer": "default", "applied": 0, "stop": "idle", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );
    assert_eq!(
        lab.apply(&[]),
        json!({"flows": [], "flows_total": 0, "truncated": false})
    );

    // gap: seq 2 stored, seq 1 missing.
    lab.receive(&reservation("G", 2, "confirmed", 4));
    assert_eq!(
        lab.apply(&["--flow", "G"]),
        json!({"flows": [{"flow_id": "G", "producer": "default", "applied": 0, "stop": "gap", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );
    lab.receive(&reservation("G", 1, "reserved", 4));
    assert_eq!(
        lab.apply(&["--flow", "G"]),
        json!({"flows": [{"flow_id": "G", "producer": "default", "applied": 2, "stop": "idle", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );

    // blocked, with each reason.
    let blocked = [
        (
            "S",
            envelope("S-1", "S", 1, 9, "reserved", json!({"amount": 1})),
            "unsupported_schema",
        ),
        (
            "P",
            envelope("P-1", "P", 1, 1, "reserved", json!({"amount": 0})),
            "invalid_payload",
        ),
        (
            "T",
            envelope("T-1", "T", 1, 1, "released", json!({"amount": 1})),
            "invalid_transition",
        ),
    ];
    for (flow, input, reason) in &blocked {
        lab.receive(input);
        let expected = json!({"flows": [{"flow_id": flow, "producer": "default", "applied": 0, "stop": "blocked", "reason": reason, "detail": null}], "flows_total": 1, "truncated": false});
        assert_eq!(lab.apply(&["--flow", flow]), expected);
        // Stays blocked.
        assert_eq!(lab.apply(&["--flow", flow]), expected);
    }

    let snapshot = lab.snapshot();
    let inbox = &snapshot["consumer"]["inbox"];
    for (flow, input, reason) in &blocked {
        let stored = row(inbox, "flow_id", flow);
        let mut expected: Value = serde_json::from_str(input).unwrap();
        expected["status"] = json!("blocked");
        expected["reason"] = json!(reason);
        expected["detail"] = json!(null);
        expected["producer"] = json!("default");
        expected["store_id"] = json!(null);
        assert_eq!(stored, &expected, "blocked rows keep their body");
    }
    assert_eq!(
        row(&snapshot["consumer"]["projection"], "flow_id", "A"),
        &json!({"flow_id": "A", "producer": "default", "state": "released", "quantity": 4, "applied_seq": 3})
    );
    assert_eq!(
        row(&snapshot["consumer"]["projection"], "flow_id", "G"),
        &json!({"flow_id": "G", "producer": "default", "state": "confirmed", "quantity": 4, "applied_seq": 2})
    );
    assert_eq!(snapshot["consumer"]["effects"].as_array().unwrap().len(), 5);
}

#[test]
fn apply_limit_applies_per_flow_without_flow() {
    let lab = Lab::new();
    lab.full_flow("A", 1);
    lab.full_flow("B", 2);
    lab.relay(&[]);
    let out = lab.apply(&["--limit", "1"]);
    let flows = &out["flows"];
    assert_eq!(flows.as_array().unwrap().len(), 2, "{out}");
    for flow in ["A", "B"] {
        assert_eq!(
            row(flows, "flow_id", flow),
            &json!({"flow_id": flow, "producer": "default", "applied": 1, "stop": "limit", "reason": null, "detail": null})
        );
    }
    let out = lab.apply(&[]);
    for flow in ["A", "B"] {
        assert_eq!(
            row(&out["flows"], "flow_id", flow),
            &json!({"flow_id": flow, "producer": "default", "applied": 2, "stop": "idle", "reason": null, "detail": null})
        );
    }
}

#[test]
fn apply_support_v2_applies_the_stored_schema_2_row() {
    let lab = Lab::new();
    let committed = lab
        .advance_out("V", 0, "reserved", Some(42), Some(2))
        .json();
    assert_eq!(committed["event"]["payload"], json!({"units": 42}));
    lab.relay(&[]);
    assert_eq!(
        lab.apply(&[]),
        json!({"flows": [{"flow_id": "V", "producer": "default", "applied": 0, "stop": "blocked", "reason": "unsupported_schema", "detail": null}], "flows_total": 1, "truncated": false})
    );
    let stored = row(&lab.snapshot()["consumer"]["inbox"], "event_id", "V-1").clone();
    assert_eq!(stored["status"], "blocked");
    assert_eq!(stored["reason"], "unsupported_schema");

    // Without --support-v2 a plain apply visits no flow: nothing is pending.
    assert_eq!(
        lab.apply(&[]),
        json!({"flows": [], "flows_total": 0, "truncated": false})
    );
    assert_eq!(
        lab.apply(&["--support-v2"]),
        json!({"flows": [{"flow_id": "V", "producer": "default", "applied": 1, "stop": "idle", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );
    let snapshot = lab.snapshot();
    let mut expected = committed["event"].clone();
    expected["status"] = json!("applied");
    expected["reason"] = json!(null);
    expected["detail"] = json!(null);
    expected["producer"] = json!("default");
    // Relayed: the producer store delivered it.
    expected["store_id"] = snapshot["producer"]["store_id"].clone();
    assert_eq!(snapshot["consumer"]["inbox"], json!([expected]));
    assert_applied(
        &snapshot,
        json!([{"flow_id": "V", "producer": "default", "state": "reserved", "quantity": 42, "applied_seq": 1}]),
        &[("V", 1)],
    );
}

#[test]
fn apply_process_all_isolates_blocked_and_gapped_flows() {
    let lab = Lab::new();
    lab.receive(&envelope(
        "X-1",
        "X",
        1,
        9,
        "reserved",
        json!({"amount": 1}),
    ));
    lab.receive(&reservation("Y", 2, "confirmed", 2));
    lab.full_flow("Z", 3);
    lab.relay(&[]);
    let out = lab.apply(&[]);
    let flows = &out["flows"];
    assert_eq!(flows.as_array().unwrap().len(), 3, "{out}");
    assert_eq!(
        row(flows, "flow_id", "X"),
        &json!({"flow_id": "X", "producer": "default", "applied": 0, "stop": "blocked", "reason": "unsupported_schema", "detail": null})
    );
    assert_eq!(
        row(flows, "flow_id", "Y"),
        &json!({"flow_id": "Y", "producer": "default", "applied": 0, "stop": "gap", "reason": null, "detail": null})
    );
    assert_eq!(
        row(flows, "flow_id", "Z"),
        &json!({"flow_id": "Z", "producer": "default", "applied": 3, "stop": "idle", "reason": null, "detail": null})
    );
    let snapshot = lab.snapshot();
    assert_applied(
        &snapshot,
        json!([{"flow_id": "Z", "producer": "default", "state": "released", "quantity": 3, "applied_seq": 3}]),
        &[("Z", 1), ("Z", 2), ("Z", 3)],
    );
}

#[test]
fn apply_invalid_arguments_exit_2_and_create_nothing() {
    let lab = Lab::new();
    lab.apply_out(&["--limit", "0"]).usage("--limit");
    lab.apply_out(&["--limit", "two"]).usage("--limit");
    lab.apply_out(&["--flow", "a.b"]).usage("--flow");
    lab.apply_out(&["--flow", &"f".repeat(101)]).usage("--flow");
    lab.apply_out(&["--support-v3"]).usage("--support-v3");
    lab.assert_no_files();
    lab.receive(&reservation("A", 1, "reserved", 1));
    let before = lab.files();
    lab.apply_out(&["--flow", "A", "--limit", "0"])
        .usage("--limit");
    lab.files().assert_unchanged(&before, "invalid input");
    assert_eq!(lab.snapshot()["consumer"]["projection"], json!([]));
}

// ---------------------------------------------------------------- snapshot

#[test]
fn snapshot_has_every_row_with_the_contract_keys() {
    let lab = Lab::new();
    let empty = lab.snapshot();
    let store_id = |side: &str| {
        empty[side]["store_id"]
            .as_str()
            .expect("a store id")
            .to_owned()
    };
    assert_eq!(
        empty,
        json!({
            "producer": {"store_id": store_id("producer"), "producer_name": "default", "flows": [], "outbox": []},
            "consumer": {"store_id": store_id("consumer"), "inbox": [], "projection": [], "effects": []},
        })
    );

    lab.advance("A", 0, "reserved", Some(8));
    lab.advance("A", 1, "confirmed", None);
    lab.advance("B", 0, "reserved", Some(1));
    lab.relay(&["--max", "1", "--policy", "first-pending"]);
    lab.apply(&[]);
    lab.receive(&envelope(
        "Q-1",
        "Q",
        1,
        7,
        "reserved",
        json!({"amount": 1}),
    ));
    lab.apply(&["--flow", "Q"]);

    let snapshot = lab.snapshot();
    assert_eq!(keys(&snapshot), ["consumer", "producer"]);
    assert_eq!(
        keys(&snapshot["producer"]),
        ["flows", "outbox", "producer_name", "store_id"]
    );
    assert_eq!(
        keys(&snapshot["consumer"]),
        ["effects", "inbox", "projection", "store_id"]
    );

    let mut outbox_keys = ENVELOPE_KEYS.to_vec();
    outbox_keys.extend(["accepted", "destinations"]);
    let mut inbox_keys = ENVELOPE_KEYS.to_vec();
    inbox_keys.extend(["status", "reason", "detail", "producer", "store_id"]);
    let tables: [(&str, &str, Vec<&str>); 5] = [
        (
            "producer",
            "flows",
            vec!["flow_id", "state", "quantity", "last_seq"],
        ),
        ("producer", "outbox", outbox_keys),
        ("consumer", "inbox", inbox_keys),
        (
            "consumer",
            "projection",
            vec!["flow_id", "producer", "state", "quantity", "applied_seq"],
        ),
        (
            "consumer",
            "effects",
            vec!["flow_id", "producer", "seq", "event_id"],
        ),
    ];
    for (side, table, expected) in &tables {
        let rows = snapshot[side][table].as_array().unwrap();
        assert!(!rows.is_empty(), "{side}.{table} is empty");
        for r in rows {
            assert_eq!(keys(r), sorted(expected), "{side}.{table}: {r}");
        }
    }

    assert_eq!(
        snapshot["producer"]["flows"],
        json!([
            {"flow_id": "A", "state": "confirmed", "quantity": 8, "last_seq": 2},
            {"flow_id": "B", "state": "reserved", "quantity": 1, "last_seq": 1},
        ])
    );
    // Each row's one destination, `default`, holds it as the row says.
    let mut outbox = snapshot["producer"]["outbox"].clone();
    for r in outbox.as_array_mut().unwrap() {
        let custody = r.as_object_mut().unwrap().remove("destinations").unwrap();
        assert_eq!(keys(&custody), ["default"], "{custody}");
        assert_eq!(
            keys(&custody["default"]),
            sorted(&CUSTODY_KEYS),
            "{custody}"
        );
        assert_eq!(custody["default"]["accepted"], r["accepted"], "{custody}");
    }
    assert_eq!(
        outbox,
        json!([
            {"event_id": "A-1", "flow_id": "A", "seq": 1, "schema_version": 1,
             "type": "reserved", "payload": {"amount": 8}, "accepted": true},
            {"event_id": "A-2", "flow_id": "A", "seq": 2, "schema_version": 1,
             "type": "confirmed", "payload": {"amount": 8}, "accepted": false},
            {"event_id": "B-1", "flow_id": "B", "seq": 1, "schema_version": 1,
             "type": "reserved", "payload": {"amount": 1}, "accepted": false},
        ])
    );
    assert_eq!(
        snapshot["consumer"]["inbox"],
        json!([
            {"event_id": "A-1", "flow_id": "A", "seq": 1, "schema_version": 1,
             "type": "reserved", "payload": {"amount": 8}, "status": "applied", "reason": null,
             "detail": null, "producer": "default",
             // Relayed: delivered by the producer store; received: unknown.
             "store_id": snapshot["producer"]["store_id"]},
            {"event_id": "Q-1", "flow_id": "Q", "seq": 1, "schema_version": 7,
             "type": "reserved", "payload": {"amount": 1}, "status": "blocked",
             "reason": "unsupported_schema", "detail": null, "producer": "default",
             "store_id": null},
        ])
    );
    assert_applied(
        &snapshot,
        json!([{"flow_id": "A", "producer": "default", "state": "reserved", "quantity": 8, "applied_seq": 1}]),
        &[("A", 1)],
    );
}

// ---------------------------------------------------------------- text output

#[test]
fn text_output_is_human_readable() {
    let lab = Lab::new();
    let out = run(&["init", "--producer", &lab.p, "--consumer", &lab.c]);
    assert!(out.text().contains(&lab.p), "{out:#?}");
    let mut advance = advance_args(&lab.p, "A", "0", "reserved");
    advance.extend(["--quantity", "3"]);
    let out = run(&advance);
    assert!(out.text().contains("committed"), "{out:#?}");
    let out = run(&["relay", "--producer", &lab.p, "--consumer", &lab.c]);
    assert!(out.text().contains("A-1"), "{out:#?}");
    let out = run(&["apply", "--consumer", &lab.c]);
    assert!(out.text().contains('A'), "{out:#?}");
    let out = run(&["snapshot", "--producer", &lab.p, "--consumer", &lab.c]);
    assert!(out.text().contains("A-1"), "{out:#?}");
    let out = run_bytes(
        &["receive", "--consumer", &lab.c],
        reservation("A", 1, "reserved", 3).as_bytes(),
    );
    assert!(out.text().contains("duplicate"), "{out:#?}");
}

// ---------------------------------------------------------------- demo

#[test]
fn demo_runs_and_refuses_to_overwrite_without_force() {
    let lab = Lab::new();
    let dir = lab.path("demo");
    let out = run(&["demo", "--dir", &dir, "--flows", "20"]);
    let text = out.text();
    assert!(text.contains("60"), "{text}");
    assert!(text.contains("OK"), "{text}");
    let files: Vec<String> = ["producer.db", "consumer.db"]
        .iter()
        .map(|name| common::join(Path::new(&dir), name))
        .collect();
    let before: Vec<_> = files.iter().map(|f| bytes(f)).collect();
    assert!(before.iter().all(Option::is_some));

    for json_flag in [false, true] {
        let mut args = vec!["demo", "--dir", &dir, "--flows", "20"];
        if json_flag {
            args.push("--json");
        }
        run(&args).usage("--force");
        let after: Vec<_> = files.iter().map(|f| bytes(f)).collect();
        assert_eq!(after, before, "demo without --force touched the files");
    }

    let out = run(&["demo", "--dir", &dir, "--flows", "20", "--force", "--json"]).json();
    for (key, value) in [
        ("produced", json!(60)),
        ("delivered", json!(60)),
        ("applied", json!(60)),
        ("blocked", json!(0)),
        ("ok", json!(true)),
    ] {
        assert_eq!(out[key], value, "{key} in {out}");
    }
    // The files hold exactly the demo's 20 flows (not 40).
    let snapshot = run(&[
        "snapshot",
        "--json",
        "--producer",
        &files[0],
        "--consumer",
        &files[1],
    ])
    .json();
    assert_eq!(snapshot["producer"]["flows"].as_array().unwrap().len(), 20);
    assert_eq!(
        snapshot["consumer"]["effects"].as_array().unwrap().len(),
        60
    );

    run(&["demo", "--dir", &dir, "--flows", "0"]).usage("--flows");
}
