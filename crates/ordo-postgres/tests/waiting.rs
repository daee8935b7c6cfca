//! An appended outbox row waits for the destinations its flow was given
//! to: it is inserted counting every destination, and written again only
//! when its flow was given to another number (a flow abandoned at a
//! destination; a flow abandoned everywhere settles its rows at once).

mod support;

use std::sync::Arc;

use ordo_core::destination::{AbandonRequest, DestinationStart};
use ordo_core::{
    DestinationName, Envelope, FlowId, ProducerOps, ProducerStore, Receipt, SystemClock,
};
use ordo_postgres::{PgOptions, PgProducer, Schema};
use support::{admin_client, fresh_database};

const SCHEMA: &str = "waiting_p";

fn event(flow: &str, seq: i64) -> Envelope {
    Envelope::parse_str(&format!(
        r#"{{"event_id": "{flow}-{seq}", "flow_id": "{flow}", "seq": {seq},
            "schema_version": 1, "type": "t", "payload": {{}}}}"#
    ))
    .unwrap()
}

fn name(name: &str) -> DestinationName {
    DestinationName::new(name).unwrap()
}

fn abandon(p: &mut PgProducer, destination: &str, flow: &str) {
    let request = AbandonRequest {
        destination: name(destination),
        flow: FlowId::new(flow).unwrap(),
        by: "ops".into(),
        reason: "test".into(),
    };
    p.abandon_flow(&request).unwrap().expect("abandoned");
}

/// The outbox row of `event_id` as stored: destinations waiting, settled,
/// and its marks.
fn stored(target: &str, event_id: &str) -> (i64, bool, bool, i64) {
    let row = admin_client(target)
        .query_one(
            &format!(
                "SELECT o.destinations_waiting, o.accepted, o.accepted_at_ms IS NOT NULL,
                        (SELECT count(*) FROM {SCHEMA}.custody c WHERE c.position = o.position)
                 FROM {SCHEMA}.outbox o WHERE o.event_id = $1"
            ),
            &[&event_id],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

#[test]
fn an_appended_row_waits_for_the_destinations_its_flow_was_given_to() {
    let (_dir, target) = fresh_database();
    let options = PgOptions {
        schema: Some(SCHEMA.into()),
        ..PgOptions::default()
    };
    let domain = Schema::new("waiting").unwrap();
    let mut p = PgProducer::open_with(&target, &domain, Arc::new(SystemClock), &options).unwrap();
    p.add_destination(&name("billing"), DestinationStart::Start)
        .unwrap()
        .unwrap();
    p.append_events(&[event("A", 1), event("B", 1), event("C", 1)])
        .unwrap();
    assert_eq!(
        stored(&target, "A-1"),
        (2, false, false, 2),
        "every destination"
    );

    // A flow abandoned at one destination: its next rows wait for the other.
    abandon(&mut p, "billing", "A");
    // Abandoned everywhere: its next rows are settled at once.
    abandon(&mut p, "billing", "B");
    abandon(&mut p, "default", "B");
    p.append_events(&[event("A", 2), event("B", 2), event("C", 2), event("D", 1)])
        .unwrap();
    assert_eq!(stored(&target, "A-2"), (1, false, false, 1), "default only");
    assert_eq!(
        stored(&target, "B-2"),
        (0, true, true, 0),
        "settled at once"
    );
    assert_eq!(stored(&target, "C-2"), (2, false, false, 2), "both");
    assert_eq!(
        stored(&target, "D-1"),
        (2, false, false, 2),
        "a new flow: both"
    );

    // Held by default, the row no other destination waits for is settled.
    p.use_destination(Some(&name("default"))).unwrap().unwrap();
    let a2 = event("A", 2).event_id;
    p.record_receipts(&[(a2, Receipt::Accepted)], 1).unwrap();
    assert_eq!(stored(&target, "A-2"), (0, true, true, 1), "settled");
}
