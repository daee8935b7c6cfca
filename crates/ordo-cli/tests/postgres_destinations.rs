//! A producer store's destinations on PostgreSQL, as real processes against
//! a real server (`ORDO_TEST_PG`, see `pgdb`): `--producer URL` and
//! `--consumer URL` with `destination add|list|remove`, `relay
//! --destination`, `outbox abandon|repairs` and `inbox list
//! --producer-name`, their JSON keys and exit codes as CLI.md says (third
//! release).

mod common;
mod pgdb;

use common::{keys, receipts, row, sorted, Lab, Out};
use pgdb::Database;
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000_000;
const MINUTE: i64 = 60_000;

/// The keys of one destination in `destination list --json`.
const DESTINATION_KEYS: [&str; 8] = [
    "name",
    "from",
    "consumer_store_id",
    "backlog",
    "oldest_pending_age_s",
    "quarantined",
    "rewound",
    "created_at_ms",
];

/// The keys of one row of `outbox repairs --json`.
const REPAIR_KEYS: [&str; 9] = [
    "id",
    "action",
    "destination",
    "flow_id",
    "seq",
    "event_id",
    "reason",
    "by",
    "at_ms",
];

const WHY: [&str; 4] = ["--by", "ops", "--reason", "retired"];

/// A producer named `orders` and its consumer in one database, and a
/// second consumer in another.
struct Fan {
    lab: Lab,
    _databases: (Database, Database),
    p: String,
    c: String,
    c2: String,
}

impl Fan {
    fn new() -> Fan {
        let (first, second) = (Database::create(), Database::create());
        let (url, c2) = (first.url(), second.url());
        let lab = Lab::with_stores(&url, &url);
        lab.at(T0);
        let args = ["--producer-name", "orders"];
        let init = lab.run_both("init", &args).json();
        assert_eq!(init, json!({"producer": url, "consumer": url}));
        lab.run(&["init", "--json", "--consumer", &c2]).json();
        Fan {
            lab,
            _databases: (first, second),
            p: url.clone(),
            c: url,
            c2,
        }
    }

    /// `destination ACTION --json --producer P EXTRA`.
    fn destination(&self, action: &str, extra: &[&str]) -> Out {
        let mut all = vec!["destination", action, "--json", "--producer", &self.p];
        all.extend_from_slice(extra);
        self.lab.run(&all)
    }

    fn list(&self) -> Value {
        self.destination("list", &[]).json()
    }

    fn advance(&self, flow: &str, expected_seq: &str, to: &str, quantity: Option<&str>) {
        let mut args = vec![
            "advance",
            "--json",
            "--producer",
            &self.p,
            "--flow",
            flow,
            "--expected-seq",
            expected_seq,
            "--to",
            to,
        ];
        if let Some(quantity) = quantity {
            args.extend(["--quantity", quantity]);
        }
        let out = self.lab.run(&args).json();
        assert_eq!(out["outcome"], "committed", "{out}");
    }

    /// `relay --json --destination NAME` to `consumer`: its deliveries.
    fn relay(&self, consumer: &str, destination: &str) -> Vec<(String, String)> {
        let args = [
            "relay",
            "--json",
            "--producer",
            &self.p,
            "--consumer",
            consumer,
            "--destination",
            destination,
        ];
        receipts(&self.lab.run(&args).json())
    }

    /// The consumer store's identity, from `status`.
    fn consumer_id(&self, consumer: &str) -> String {
        let args = ["status", "--json", "--consumer", consumer];
        let status = self.lab.run(&args).json();
        status["consumer"]["store_id"].as_str().unwrap().to_owned()
    }

    fn repairs(&self) -> Value {
        let args = ["outbox", "repairs", "--json", "--producer", &self.p];
        self.lab.run(&args).json()["repairs"].clone()
    }

    /// `inbox list --json --consumer C` with `extra`: `(producer, event_id,
    /// store_id)` of each row.
    fn inbox(&self, consumer: &str, extra: &[&str]) -> Vec<(String, String, Value)> {
        let mut args = vec!["inbox", "list", "--json", "--consumer", consumer];
        args.extend_from_slice(extra);
        let listed = self.lab.run(&args).json();
        (listed["inbox"].as_array().expect("an inbox list").iter())
            .map(|r| {
                let text = |key: &str| r[key].as_str().expect(key).to_owned();
                (text("producer"), text("event_id"), r["store_id"].clone())
            })
            .collect()
    }
}

#[test]
fn destinations_on_postgresql_relay_abandon_audit_and_keep_the_last() {
    let fan = Fan::new();
    let (p, c, c2) = (fan.p.as_str(), fan.c.as_str(), fan.c2.as_str());

    // A new store: named orders, one destination default.
    let list = fan.list();
    assert_eq!(list["producer_name"], "orders");
    let producer_id = list["store_id"].as_str().unwrap().to_owned();
    assert_eq!(producer_id.len(), 32, "{list}");
    // The store's first destination is stamped by the database's clock.
    let created_at_ms = list["destinations"][0]["created_at_ms"].clone();
    assert!(created_at_ms.as_i64().is_some_and(|ms| ms > 0), "{list}");
    assert_eq!(
        list["destinations"],
        json!([{"name": "default", "from": "start", "consumer_store_id": null, "backlog": 0,
                "oldest_pending_age_s": null, "quarantined": 0, "rewound": 0,
                "created_at_ms": created_at_ms}])
    );
    fan.lab.at(T0 + 1);
    assert_eq!(
        fan.destination("add", &["billing"]).json(),
        json!({"destination": "billing", "from": "start", "added": true})
    );
    fan.destination("add", &["billing"]).usage("already exists");

    let accepted = |id: &str| (id.to_owned(), "accepted".to_owned());
    // default's consumer holds another body at orders' A-1 (and an event
    // of the default producer): A's head conflicts there, not at billing.
    fan.lab.at(T0 + MINUTE);
    let other_a1 = json!({
        "event_id": "A-1", "flow_id": "A", "seq": 1, "schema_version": 1,
        "type": "reserved", "payload": {"amount": 99}, "producer": "orders",
    });
    let z1 = common::reservation("Z", 1, "reserved", 3);
    let received = fan
        .lab
        .run_bytes(
            &["receive", "--json", "--consumer", c],
            format!("{other_a1}\n{z1}\n").as_bytes(),
        )
        .json();
    assert_eq!(
        receipts(&received_as_deliveries(&received)),
        [accepted("A-1"), accepted("Z-1")]
    );
    fan.advance("A", "0", "reserved", Some("1"));
    fan.advance("B", "0", "reserved", Some("2"));

    let conflict = ("A-1".to_owned(), "conflict".to_owned());
    assert_eq!(fan.relay(c, "default"), [conflict, accepted("B-1")]);
    assert_eq!(fan.relay(c2, "billing"), [accepted("A-1"), accepted("B-1")]);
    let relay_both = ["relay", "--json", "--producer", p, "--consumer", c];
    fan.lab
        .run(&relay_both)
        .usage("name one with --destination");

    fan.lab.at(T0 + 2 * MINUTE);
    let list = fan.list();
    let destinations = &list["destinations"];
    for d in destinations.as_array().unwrap() {
        assert_eq!(keys(d), sorted(&DESTINATION_KEYS), "{d}");
    }
    let (c_id, c2_id) = (fan.consumer_id(c), fan.consumer_id(c2));
    assert_ne!(c_id, c2_id);
    assert_eq!(
        row(destinations, "name", "billing"),
        &json!({"name": "billing", "from": "start", "consumer_store_id": c2_id, "backlog": 0,
                "oldest_pending_age_s": null, "quarantined": 0, "rewound": 0,
                "created_at_ms": T0 + 1})
    );
    let default = row(destinations, "name", "default");
    assert_eq!(
        (
            &default["consumer_store_id"],
            &default["backlog"],
            &default["quarantined"],
            &default["rewound"]
        ),
        (&json!(c_id), &json!(1), &json!(1), &json!(0)),
        "{default}"
    );
    let age = default["oldest_pending_age_s"].as_f64().expect("an age");
    assert_eq!(age, 60.0, "A-1 was committed a minute ago: {default}");

    // Abandoned for default, audited; refusals exit 2 and are not.
    fan.lab.at(T0 + 3 * MINUTE);
    let abandon = |destination: &str, flow: &str, extra: &[&str]| {
        let mut all = vec!["outbox", "abandon", "--json", "--producer", p];
        all.extend(["--destination", destination, "--flow", flow]);
        all.extend_from_slice(extra);
        fan.lab.run(&all)
    };
    abandon("default", "Z", &WHY).usage("no flow Z");
    abandon("nowhere", "A", &WHY).usage("no destination named nowhere");
    abandon("default", "A", &["--by", "ops", "--reason", ""]).usage("--reason");
    assert_eq!(fan.repairs(), json!([]), "refusals are not audited");
    let abandoned = abandon("default", "A", &WHY).json();
    let abandon_row = json!({"id": 1, "action": "abandon", "destination": "default",
        "flow_id": "A", "seq": 1, "event_id": "A-1", "reason": "retired", "by": "ops",
        "at_ms": T0 + 3 * MINUTE});
    assert_eq!(abandoned, abandon_row);
    abandon("default", "A", &WHY).usage("already abandoned");
    let repairs = fan.repairs();
    assert_eq!(repairs, json!([abandon_row]));
    assert_eq!(keys(&repairs[0]), sorted(&REPAIR_KEYS));
    let default = row(&fan.list()["destinations"], "name", "default").clone();
    assert_eq!(
        (&default["backlog"], &default["quarantined"]),
        (&json!(0), &json!(0)),
        "{default}"
    );
    assert!(fan.relay(c, "default").is_empty(), "A is retired there");

    // Each producer's rows at the consumer, by name; the relayed ones
    // carry the producer store that delivered them.
    let from_producer = json!(producer_id);
    assert_eq!(
        fan.inbox(c, &["--producer-name", "orders"]),
        [
            ("orders".into(), "A-1".into(), Value::Null),
            ("orders".into(), "B-1".into(), from_producer.clone()),
        ]
    );
    assert_eq!(
        fan.inbox(c, &["--producer-name", "default"]),
        [("default".into(), "Z-1".into(), Value::Null)]
    );
    assert_eq!(fan.inbox(c, &[]).len(), 3, "every producer's rows");
    assert_eq!(
        fan.inbox(c2, &["--producer-name", "orders"]),
        [
            ("orders".into(), "A-1".into(), from_producer.clone()),
            ("orders".into(), "B-1".into(), from_producer),
        ]
    );
    assert!(fan.inbox(c2, &["--producer-name", "default"]).is_empty());
    let flow = ["--producer-name", "orders", "--flow", "A"];
    let held = fan.inbox(c, &flow);
    assert_eq!(held.len(), 1, "{held:?}");
    fan.lab
        .run(&[
            "inbox",
            "list",
            "--json",
            "--consumer",
            c,
            "--producer-name",
            "Orders",
        ])
        .usage("producer name");

    // Removing: audited; the last one cannot be removed.
    fan.lab.at(T0 + 4 * MINUTE);
    let remove = |name: &str| {
        let mut all = vec!["destination", "remove", "--json", "--producer", p, name];
        all.extend(["--by", "ops", "--reason", "moved"]);
        fan.lab.run(&all)
    };
    assert_eq!(
        remove("default").json(),
        json!({"destination": "default", "removed": true})
    );
    remove("billing").usage("last one");
    remove("default").usage("no destination named default");
    let names: Vec<Value> = (fan.list()["destinations"].as_array().unwrap().iter())
        .map(|d| d["name"].clone())
        .collect();
    assert_eq!(names, [json!("billing")]);
    let repairs = fan.repairs();
    let remove_row = json!({"id": 2, "action": "destination_remove", "destination": "default",
        "flow_id": null, "seq": null, "event_id": null, "reason": "moved", "by": "ops",
        "at_ms": T0 + 4 * MINUTE});
    assert_eq!(repairs, json!([abandon_row, remove_row]));
    for r in repairs.as_array().unwrap() {
        assert_eq!(keys(r), sorted(&REPAIR_KEYS), "{r}");
    }
    // With one destination again, relay needs no --destination.
    fan.advance("C", "0", "reserved", Some("3"));
    let relayed = fan
        .lab
        .run(&["relay", "--json", "--producer", p, "--consumer", c2])
        .json();
    assert_eq!(receipts(&relayed), [accepted("C-1")]);
}

/// `receive --json`'s receipts under the key a relay report's deliveries
/// have, for [`receipts`].
fn received_as_deliveries(received: &Value) -> Value {
    json!({ "deliveries": received["receipts"] })
}
