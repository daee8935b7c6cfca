//! A producer store's destinations on the command line (CLI.md, third
//! release): `destination add|list|remove`, `--destination` on `relay` and
//! `outbox retry|list`, aggregates in `status`, pruning that waits for
//! every destination a flow is delivered to, and `outbox abandon`.

mod common;

use common::*;
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000_000;
const MINUTE: i64 = 60_000;

/// A lab with a second consumer file, `c2.db`.
struct Fan {
    lab: Lab,
    c2: String,
}

impl Fan {
    fn new() -> Fan {
        let lab = Lab::new();
        lab.at(T0).init();
        let c2 = lab.path("c2.db");
        Fan { lab, c2 }
    }

    fn p(&self) -> &str {
        &self.lab.p
    }

    fn destination(&self, args: &[&str]) -> Out {
        let mut all = vec!["destination", args[0], "--json", "--producer", self.p()];
        all.extend_from_slice(&args[1..]);
        self.lab.run(&all)
    }

    fn list(&self) -> Value {
        self.destination(&["list"]).json()["destinations"].clone()
    }

    /// `relay --json` to `consumer` with extra arguments.
    fn relay_out(&self, consumer: &str, extra: &[&str]) -> Out {
        let mut all = vec![
            "relay",
            "--json",
            "--producer",
            self.p(),
            "--consumer",
            consumer,
        ];
        all.extend_from_slice(extra);
        self.lab.run(&all)
    }

    fn delivered(&self, consumer: &str, destination: &str) -> Vec<String> {
        let report = self
            .relay_out(consumer, &["--destination", destination])
            .json();
        receipts(&report).into_iter().map(|(id, _)| id).collect()
    }

    fn status(&self) -> Value {
        let args = ["status", "--json", "--producer", self.p()];
        self.lab.run(&args).json()["producer"].clone()
    }

    fn outbox(&self, extra: &[&str]) -> Value {
        let mut all = vec!["outbox", "list", "--json", "--producer", self.p()];
        all.extend_from_slice(extra);
        self.lab.run(&all).json()["outbox"].clone()
    }

    fn prune(&self) -> u64 {
        let args = [
            "prune",
            "--json",
            "--producer",
            self.p(),
            "--older-than",
            "1m",
        ];
        let out = self.lab.run(&args).json();
        out["producer"]["removed"].as_u64().expect("a count")
    }
}

fn names(destinations: &Value) -> Vec<&str> {
    (destinations.as_array().unwrap().iter())
        .map(|d| d["name"].as_str().unwrap())
        .collect()
}

#[test]
fn a_new_store_has_default_and_destinations_are_added_and_removed() {
    let fan = Fan::new();
    let list = fan.destination(&["list"]).json();
    assert_eq!(list["producer_name"], "default");
    assert_eq!(list["store_id"].as_str().map(str::len), Some(32));
    assert_eq!(
        list["destinations"],
        json!([{"name": "default", "from": "start", "consumer_store_id": null, "backlog": 0,
                "oldest_pending_age_s": null, "quarantined": 0, "rewound": 0,
                "created_at_ms": list["destinations"][0]["created_at_ms"]}])
    );
    fan.lab.at(T0 + 1);
    let added = fan.destination(&["add", "billing", "--from", "now"]);
    assert_eq!(
        added.json(),
        json!({"destination": "billing", "from": "now", "added": true})
    );
    assert_eq!(names(&fan.list()), ["billing", "default"]);
    assert_eq!(fan.list()[0]["created_at_ms"], json!(T0 + 1));

    fan.destination(&["add", "billing"]).usage("already exists");
    fan.destination(&["add", "Billing"])
        .usage("destination name");
    fan.destination(&["add", "x", "--from", "later"])
        .usage("start or now");
    let why = ["--by", "ops", "--reason", "moved"];
    fan.destination(&[&["remove", "nowhere"][..], &why].concat())
        .usage("no destination named nowhere");
    fan.destination(&["remove", "billing", "--by", " ", "--reason", "r"])
        .usage("--by");
    let removed = fan.destination(&[&["remove", "default"][..], &why].concat());
    assert_eq!(
        removed.json(),
        json!({"destination": "default", "removed": true})
    );
    fan.destination(&[&["remove", "billing"][..], &why].concat())
        .usage("last one");
    assert_eq!(names(&fan.list()), ["billing"]);
    let repairs = ["outbox", "repairs", "--json", "--producer", fan.p()];
    assert_eq!(
        fan.lab.run(&repairs).json(),
        json!({"repairs": [{"id": 1, "action": "destination_remove", "destination": "default",
            "flow_id": null, "seq": null, "event_id": null, "reason": "moved", "by": "ops",
            "at_ms": T0 + 1}]}),
        "audited, the refusals not"
    );
}

#[test]
fn with_two_destinations_relay_and_retry_must_name_one_writing_nothing() {
    let fan = Fan::new();
    fan.lab.advance("A", 0, "reserved", Some(1));
    fan.destination(&["add", "billing"]).json();
    let before = Files::of(&[fan.p(), &fan.lab.c]);
    fan.relay_out(&fan.lab.c, &[])
        .usage("name one with --destination");
    fan.relay_out(&fan.lab.c, &["--event", "A-1"])
        .usage("name one with --destination");
    fan.relay_out(&fan.lab.c, &["--destination", "nowhere"])
        .usage("no destination named nowhere");
    let retry = ["outbox", "retry", "--json", "--producer", fan.p(), "A-1"];
    fan.lab.run(&retry).usage("name one with --destination");
    Files::of(&[fan.p(), &fan.lab.c]).assert_unchanged(&before, "refused");
    assert_eq!(fan.delivered(&fan.lab.c, "default"), ["A-1"]);
}

#[test]
fn a_destination_added_from_now_gets_only_the_flows_begun_after_it() {
    let fan = Fan::new();
    fan.lab.advance("A", 0, "reserved", Some(1));
    fan.destination(&["add", "late", "--from", "now"]).json();
    fan.destination(&["add", "early"]).json();
    fan.lab.advance("A", 1, "confirmed", None);
    fan.lab.advance("B", 0, "reserved", Some(2));
    // From start: every flow from seq 1; from now: only B.
    assert_eq!(fan.delivered(&fan.lab.c, "early"), ["A-1", "B-1", "A-2"]);
    assert_eq!(fan.delivered(&fan.c2, "late"), ["B-1"]);
    fan.relay_out(&fan.c2, &["--destination", "late", "--event", "A-2"])
        .usage("flow A is not delivered to destination late");
    let rows = fan.outbox(&[]);
    let a2 = row(&rows, "event_id", "A-2");
    assert_eq!(a2["accepted"], json!(false), "default does not hold it yet");
    let destinations: Vec<&String> = a2["destinations"].as_object().unwrap().keys().collect();
    assert_eq!(destinations, ["default", "early"]);
    let late = fan.outbox(&["--destination", "late"]);
    let ids: Vec<&str> = (late.as_array().unwrap().iter())
        .map(|r| r["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["B-1"], "its own rows, under a row's keys");
    assert_eq!(late[0]["accepted"], json!(true));
}

#[test]
fn one_destination_down_the_other_goes_on_prune_waits_and_it_catches_up() {
    let fan = Fan::new();
    fan.destination(&["add", "billing"]).json();
    fan.lab.at(T0).advance("A", 0, "reserved", Some(1));
    fan.lab.advance("B", 0, "reserved", Some(2));
    // billing's consumer is down: default goes on alone.
    assert_eq!(fan.delivered(&fan.lab.c, "default"), ["A-1", "B-1"]);
    let status = fan.status_of_lab(T0 + 10 * MINUTE);
    assert_eq!(status["backlog"], json!(2), "{status}");
    assert_eq!(status["destinations"]["default"]["backlog"], json!(0));
    assert_eq!(status["destinations"]["billing"]["backlog"], json!(2));
    assert_eq!(status["oldest_pending_age_s"], json!(600.0));
    let rows = fan.outbox(&[]);
    assert_eq!(row(&rows, "event_id", "A-1")["accepted"], json!(false));
    assert_eq!(fan.prune(), 0, "billing does not hold them");
    let breach = fan.lab.run(&[
        "status",
        "--json",
        "--producer",
        fan.p(),
        "--max-backlog",
        "1",
    ]);
    assert_eq!(breach.code, 3, "{breach:?}");
    let breaches: Value = serde_json::from_str(&breach.stdout).unwrap();
    assert_eq!(
        breaches["breaches"],
        json!([{"signal": "backlog", "value": 2, "threshold": 1, "destination": "billing"}])
    );

    // billing's consumer is back: it catches up, and pruning goes on.
    assert_eq!(fan.delivered(&fan.c2, "billing"), ["A-1", "B-1"]);
    assert_eq!(fan.status_of_lab(T0 + 20 * MINUTE)["backlog"], json!(0));
    let rows = fan.outbox(&[]);
    assert_eq!(row(&rows, "event_id", "A-1")["accepted"], json!(true));
    assert_eq!(fan.prune(), 2);
}

impl Fan {
    fn status_of_lab(&self, now_ms: i64) -> Value {
        self.lab.at(now_ms);
        self.status()
    }
}

impl Fan {
    /// `outbox abandon --json` of `flow` for `destination` with `extra`.
    fn abandon(&self, destination: &str, flow: &str, extra: &[&str]) -> Out {
        let mut all = vec![
            "outbox",
            "abandon",
            "--json",
            "--producer",
            self.p(),
            "--destination",
            destination,
            "--flow",
            flow,
        ];
        all.extend_from_slice(extra);
        self.lab.run(&all)
    }

    fn repairs(&self) -> Value {
        let args = ["outbox", "repairs", "--json", "--producer", self.p()];
        self.lab.run(&args).json()["repairs"].clone()
    }

    /// `status --max-quarantined 0` and `--max-rewound 0`: its exit code.
    fn alarmed(&self) -> i32 {
        let args = [
            "status",
            "--json",
            "--producer",
            self.p(),
            "--max-quarantined",
            "0",
            "--max-rewound",
            "0",
        ];
        self.lab.run(&args).code
    }
}

const WHY: [&str; 4] = ["--by", "ops", "--reason", "retired"];

/// One destination's custody of the row of `event_id`.
fn custody_at(fan: &Fan, event_id: &str, destination: &str) -> Value {
    row(&fan.outbox(&[]), "event_id", event_id)["destinations"][destination].clone()
}

#[test]
fn abandon_retires_a_quarantined_flow_for_one_destination_only() {
    let fan = Fan::new();
    fan.destination(&["add", "billing"]).json();
    // The default consumer holds another body at A-1: A's head conflicts there.
    fan.lab.receive(&reservation("A", 1, "reserved", 99));
    fan.lab.advance("A", 0, "reserved", Some(1));
    fan.lab.advance("B", 0, "reserved", Some(2));
    fan.destination(&["add", "late", "--from", "now"]).json();
    let relay = fan
        .relay_out(&fan.lab.c, &["--destination", "default"])
        .json();
    assert_eq!(
        receipts(&relay),
        [
            ("A-1".into(), "conflict".into()),
            ("B-1".into(), "accepted".into())
        ]
    );
    let status = fan.status();
    assert_eq!(status["destinations"]["default"]["quarantined"], json!(1));
    assert_eq!(fan.alarmed(), 3, "the quarantine breaches");

    // Refusals: exit 2, nothing written.
    let before = Files::of(&[fan.p(), &fan.lab.c, &fan.c2]);
    fan.abandon("nowhere", "A", &WHY)
        .usage("no destination named nowhere");
    fan.abandon("default", "Z", &WHY).usage("no flow Z");
    fan.abandon("late", "A", &WHY)
        .usage("flow A is not delivered to destination late");
    fan.abandon("default", "A", &["--by", " ", "--reason", "r"])
        .usage("--by");
    fan.abandon("default", "A", &["--by", "ops", "--reason", ""])
        .usage("--reason");
    fan.abandon("default", "A", &["--by", "ops"])
        .usage("--reason");
    fan.abandon("Default", "A", &WHY).usage("destination name");
    let no_destination = [
        "outbox",
        "abandon",
        "--producer",
        fan.p(),
        "--flow",
        "A",
        "--by",
        "ops",
        "--reason",
        "r",
    ];
    fan.lab.run(&no_destination).usage("--destination");
    let missing = fan.lab.path("missing.db");
    let args = [
        &["outbox", "abandon", "--producer", &missing][..],
        &["--destination", "default", "--flow", "A"],
        &WHY,
    ]
    .concat();
    assert_eq!(fan.lab.run(&args).code, 2, "a missing store is not created");
    assert!(!std::path::Path::new(&missing).exists());
    Files::of(&[fan.p(), &fan.lab.c, &fan.c2]).assert_unchanged(&before, "refused");
    assert_eq!(fan.repairs(), json!([]), "refusals are not audited");

    fan.lab.at(T0 + MINUTE);
    let abandoned = fan.abandon("default", "A", &WHY).json();
    let audit_row = json!({"id": 1, "action": "abandon", "destination": "default",
        "flow_id": "A", "seq": 1, "event_id": "A-1", "reason": "retired", "by": "ops",
        "at_ms": T0 + MINUTE});
    assert_eq!(abandoned, audit_row);
    assert_eq!(fan.repairs(), json!([audit_row]), "in the audit log");
    let before = Files::of(&[fan.p()]);
    fan.abandon("default", "A", &WHY)
        .usage("flow A is already abandoned for destination default");
    Files::of(&[fan.p()]).assert_unchanged(&before, "refused");

    // The quarantine and its alarm are gone; billing still waits for A.
    let status = fan.status();
    assert_eq!(status["destinations"]["default"]["quarantined"], json!(0));
    assert_eq!(status["destinations"]["default"]["backlog"], json!(0));
    assert_eq!(status["destinations"]["billing"]["backlog"], json!(2));
    assert_eq!(fan.alarmed(), 0, "{status}");
    let a1 = custody_at(&fan, "A-1", "default");
    assert_eq!(a1["abandoned"], json!(true), "{a1}");
    assert_eq!(a1["quarantined"], json!(false), "{a1}");
    assert_eq!(
        custody_at(&fan, "A-1", "billing")["abandoned"],
        json!(false)
    );
    let listed = fan.outbox(&["--destination", "default"]);
    assert_eq!(
        row(&listed, "event_id", "A-1")["destinations"]["default"]["abandoned"],
        json!(true)
    );
    let quarantined = fan.outbox(&["--quarantined"]);
    assert_eq!(quarantined, json!([]), "it left the quarantine");

    // A's later events go to billing, never to default.
    fan.lab.advance("A", 1, "confirmed", None);
    assert_eq!(custody_at(&fan, "A-2", "default")["abandoned"], json!(true));
    assert!(fan.delivered(&fan.lab.c, "default").is_empty());
    fan.relay_out(&fan.lab.c, &["--destination", "default", "--event", "A-2"])
        .usage("flow A is not delivered to destination default");
    assert_eq!(fan.delivered(&fan.c2, "billing"), ["A-1", "B-1", "A-2"]);
    assert_eq!(fan.alarmed(), 0);

    // Pruning waits for billing alone for A, for both for B.
    fan.lab.at(T0 + 10 * MINUTE);
    assert_eq!(fan.prune(), 3);
    assert_eq!(fan.outbox(&[]), json!([]));
    let inbox = fan
        .lab
        .run(&["inbox", "list", "--json", "--consumer", &fan.lab.c])
        .json();
    let held = row(&inbox["inbox"], "event_id", "A-1");
    assert_eq!(
        held["payload"],
        json!({"amount": 99}),
        "default's consumer unchanged"
    );
}

#[test]
fn abandon_of_a_flow_held_everywhere_abandons_its_later_events() {
    let fan = Fan::new();
    fan.destination(&["add", "billing"]).json();
    fan.lab.advance("B", 0, "reserved", Some(2));
    assert_eq!(fan.delivered(&fan.lab.c, "default"), ["B-1"]);
    let abandoned = fan.abandon("default", "B", &WHY).json();
    assert_eq!(abandoned["seq"], json!(2), "its next seq: {abandoned}");
    assert_eq!(abandoned["event_id"], json!(null), "{abandoned}");
    assert_eq!(custody_at(&fan, "B-1", "default")["accepted"], json!(true));
    assert_eq!(
        custody_at(&fan, "B-1", "default")["abandoned"],
        json!(false)
    );
    fan.lab.advance("B", 1, "confirmed", None);
    assert_eq!(custody_at(&fan, "B-2", "default")["abandoned"], json!(true));
    assert!(fan.delivered(&fan.lab.c, "default").is_empty());
    assert_eq!(fan.delivered(&fan.c2, "billing"), ["B-1", "B-2"]);
    // Abandoned for billing too: a later event waits for nobody.
    fan.abandon("billing", "B", &WHY).json();
    fan.lab.advance("B", 2, "released", None);
    let b3 = row(&fan.outbox(&[]), "event_id", "B-3").clone();
    let abandoned_everywhere =
        (b3["destinations"].as_object().unwrap().values()).all(|c| c["abandoned"] == json!(true));
    assert!(abandoned_everywhere, "{b3}");
    assert_eq!(fan.status()["backlog"], json!(0));
    assert_eq!(fan.repairs().as_array().map(Vec::len), Some(2));
}

/// The identity of the consumer store at `consumer`.
fn consumer_id(fan: &Fan, consumer: &str) -> String {
    let status = fan
        .lab
        .run(&["status", "--json", "--consumer", consumer])
        .json();
    status["consumer"]["store_id"]
        .as_str()
        .expect("a store id")
        .to_owned()
}

#[test]
fn a_destination_keeps_to_the_consumer_of_its_first_delivery() {
    let fan = Fan::new();
    fan.lab.advance("A", 0, "reserved", Some(1));
    let a = consumer_id(&fan, &fan.lab.c);
    assert_eq!(fan.list()[0]["consumer_store_id"], json!(null));
    assert_eq!(fan.delivered(&fan.lab.c, "default"), ["A-1"]);
    assert_eq!(fan.list()[0]["consumer_store_id"], json!(a), "recorded");

    // The same destination pointed at another consumer store: refused,
    // nothing marked in the producer.
    fan.lab.advance("A", 1, "confirmed", None);
    fan.lab
        .run(&["init", "--json", "--consumer", &fan.c2])
        .json();
    let b = consumer_id(&fan, &fan.c2);
    let before = Files::of(&[fan.p()]);
    let refused = fan.relay_out(&fan.c2, &[]);
    refused.storage_error();
    for needle in [
        a.as_str(),
        b.as_str(),
        "new destination",
        "nothing was marked",
    ] {
        assert!(refused.stderr.contains(needle), "{needle}: {refused:?}");
    }
    Files::of(&[fan.p()]).assert_unchanged(&before, "nothing marked");
    let a2 = custody_at(&fan, "A-2", "default");
    assert_eq!(a2["accepted"], json!(false), "{a2}");
    assert_eq!(fan.list()[0]["consumer_store_id"], json!(a));
    assert_eq!(
        inbox_ids(&fan, &fan.c2),
        Vec::<String>::new(),
        "nothing delivered"
    );
    // Over HTTP too: the consumer's health names its store before the
    // first delivery, and nothing reaches it.
    let served = Serve::start(&fan.c2, &[]);
    let refused = fan.lab.run(&[
        "relay",
        "--json",
        "--producer",
        fan.p(),
        "--to",
        &served.url(),
    ]);
    refused.storage_error();
    assert!(refused.stderr.contains(b.as_str()), "{refused:?}");
    Files::of(&[fan.p()]).assert_unchanged(&before, "nothing marked");
    drop(served);
    assert_eq!(
        inbox_ids(&fan, &fan.c2),
        Vec::<String>::new(),
        "nothing delivered"
    );

    // Its own consumer still takes what follows.
    assert_eq!(fan.delivered(&fan.lab.c, "default"), ["A-2"]);
    assert_eq!(custody_at(&fan, "A-2", "default")["accepted"], json!(true));

    // A rebuilt consumer gets a new destination, which records its own.
    fan.destination(&["add", "rebuilt"]).json();
    assert_eq!(fan.delivered(&fan.c2, "rebuilt"), ["A-1", "A-2"]);
    let rebuilt = row(&fan.list(), "name", "rebuilt").clone();
    assert_eq!(rebuilt["consumer_store_id"], json!(b), "{rebuilt}");
}

/// The event ids `consumer`'s inbox holds.
fn inbox_ids(fan: &Fan, consumer: &str) -> Vec<String> {
    let listed = fan
        .lab
        .run(&["inbox", "list", "--json", "--consumer", consumer])
        .json();
    (listed["inbox"].as_array().expect("an inbox list").iter())
        .map(|row| row["event_id"].as_str().expect("an event id").to_owned())
        .collect()
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

#[test]
fn a_rewound_flow_is_detected_then_abandoned_and_pruning_goes_on() {
    let fan = Fan::new();
    let (p, c) = (fan.p(), fan.lab.c.as_str());
    fan.lab.at(T0).advance("a", 0, "reserved", Some(1));
    assert_eq!(fan.delivered(c, "default"), ["a-1"]);
    // No process has the file open: it is whole, without its WAL.
    let backup = fan.lab.path("backup.db");
    std::fs::copy(p, &backup).expect("a backup");
    fan.lab.advance("b", 0, "reserved", Some(1));
    assert_eq!(fan.delivered(c, "default"), ["b-1"]);

    // Restored, the producer commits b-1 again with another body.
    restore(p, &backup);
    fan.lab.advance("b", 0, "reserved", Some(2));
    fan.lab.advance("c", 0, "reserved", Some(1));
    let relay = fan.relay_out(c, &["--destination", "default"]).json();
    let causes: Vec<(&str, &str, &Value)> = (relay["deliveries"].as_array().unwrap().iter())
        .map(|d| {
            let id = d["event_id"].as_str().unwrap();
            (id, d["receipt"].as_str().unwrap(), &d["cause"])
        })
        .collect();
    let rewound = json!("producer_rewound");
    assert!(causes.contains(&("b-1", "conflict", &rewound)), "{relay}");
    assert!(
        causes
            .iter()
            .any(|(id, r, _)| (*id, *r) == ("c-1", "accepted")),
        "{relay}"
    );
    let b1 = custody_at(&fan, "b-1", "default");
    assert_eq!(b1["quarantine_reason"], rewound, "{b1}");
    let status = fan.status();
    assert_eq!(status["rewound"], json!(1), "{status}");
    assert_eq!(status["quarantined"], json!(1), "{status}");
    assert_eq!(fan.alarmed(), 3);
    // Nothing more of b goes there; other flows, new ones included, do.
    fan.lab.advance("b", 1, "confirmed", None);
    fan.lab.advance("d", 0, "reserved", Some(1));
    assert_eq!(fan.delivered(c, "default"), ["d-1"]);
    let inbox = fan
        .lab
        .run(&["inbox", "list", "--json", "--consumer", c])
        .json();
    assert_eq!(
        row(&inbox["inbox"], "event_id", "b-1")["payload"],
        json!({"amount": 1})
    );
    let held: Vec<&str> = (inbox["inbox"].as_array().unwrap().iter())
        .map(|r| r["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        held,
        ["a-1", "b-1", "c-1", "d-1"],
        "the consumer holds its b-1 alone"
    );
    assert_eq!(
        fan.prune_at(T0 + 10 * MINUTE),
        3,
        "a-1, c-1 and d-1; b waits"
    );

    // Abandoned for default: the alarms clear and pruning goes on.
    let abandoned = fan.abandon("default", "b", &WHY).json();
    assert_eq!(
        (abandoned["seq"].clone(), abandoned["event_id"].clone()),
        (json!(1), json!("b-1"))
    );
    assert_eq!(fan.alarmed(), 0, "{}", fan.status());
    assert_eq!(fan.status()["rewound"], json!(0));
    assert!(fan.delivered(c, "default").is_empty());
    assert_eq!(fan.prune_at(T0 + 20 * MINUTE), 2, "b-1 and b-2");
    assert_eq!(fan.outbox(&[]), json!([]));
    let after = fan
        .lab
        .run(&["inbox", "list", "--json", "--consumer", c])
        .json();
    assert_eq!(after["inbox"], inbox["inbox"], "the consumer unchanged");
}

impl Fan {
    fn prune_at(&self, now_ms: i64) -> u64 {
        self.lab.at(now_ms);
        self.prune()
    }
}

/// `snapshot` of a producer with two destinations, only one of which holds
/// the event: each row's bookkeeping by destination, as `outbox list`
/// prints it, and `accepted` false until both hold it.
#[test]
fn snapshot_shows_each_destination_of_a_row_and_accepted_when_all_hold_it() {
    let fan = Fan::new();
    fan.destination(&["add", "billing"]).json();
    fan.lab.at(T0 + 1).advance("A", 0, "reserved", Some(1));
    assert_eq!(fan.delivered(&fan.lab.c, "default"), ["A-1"]);
    let snapshot = |json: &[&str]| {
        let args = [&["snapshot", "--producer", fan.p()][..], json].concat();
        fan.lab.run(&args)
    };
    let out = snapshot(&["--json"]).json();
    let a1 = row(&out["producer"]["outbox"], "event_id", "A-1");
    assert_eq!(
        a1["destinations"]["default"]["accepted"],
        json!(true),
        "{a1}"
    );
    assert_eq!(a1["destinations"]["billing"]["accepted"], json!(false));
    assert_eq!(a1["accepted"], json!(false), "billing does not hold it");
    assert_eq!(
        keys(a1),
        sorted(&[
            "event_id",
            "flow_id",
            "seq",
            "schema_version",
            "type",
            "payload",
            "accepted",
            "destinations"
        ])
    );
    assert_eq!(
        a1["destinations"]["default"],
        json!({"accepted": true, "accepted_at_ms": T0 + 1, "attempts": 1,
               "last_outcome": "accepted", "last_error": null, "next_attempt_at_ms": 0,
               "quarantined": false, "quarantine_reason": null, "quarantine_detail": null,
               "abandoned": false})
    );
    let listed = row(&fan.outbox(&[]), "event_id", "A-1").clone();
    assert_eq!(a1["destinations"], listed["destinations"], "as outbox list");
    let text = snapshot(&[]).text().to_owned();
    assert!(
        text.contains("A-1 A seq 1 reserved accepted=false (billing pending, default accepted)"),
        "{text}"
    );

    assert_eq!(fan.delivered(&fan.c2, "billing"), ["A-1"]);
    let out = snapshot(&["--json"]).json();
    let a1 = row(&out["producer"]["outbox"], "event_id", "A-1");
    assert_eq!(a1["destinations"]["billing"]["accepted"], json!(true));
    assert_eq!(a1["accepted"], json!(true), "both hold it");
}
