//! `ordo soak --backend postgres` against the server of `ORDO_TEST_PG`:
//! four relays and four appliers SIGKILLed at random and their connections
//! ended by the server, with every invariant kept and the run's database
//! gone afterwards; only ordo's own connections of that database are ended;
//! the flags go together as for `experiment`; an unreachable server is named
//! without its password; and the end check of a kept database reports what
//! was broken in it.

mod common;
mod pgdb;

use common::*;
use ordo_postgres::postgres::{Client, NoTls};
use pgdb::Watched;
use serde_json::Value;

#[test]
fn a_soak_on_postgresql_keeps_every_invariant_and_leaves_no_database() {
    // One soak at a time: each compares the server's soak databases before
    // and after its run, and each run opens about twenty connections.
    let mut databases = Watched::start("ordo_soak_");
    // A session named like ordo's, in another database: never ended.
    let bystander_db = pgdb::Database::create();
    let mut bystander = Client::connect(
        &format!(
            "{}?application_name=ordo-relay-1-bystander",
            bystander_db.url()
        ),
        NoTls,
    )
    .expect("connect the bystander");
    let server = pgdb::server();
    let report = soak_ok(5, 60, 7, &["--backend", "postgres", "--url", &server]);
    assert_eq!(report["backend"], "postgres", "{report}");
    assert_eq!(report["relays"], 4, "{report}");
    assert_eq!(report["appliers"], 4, "{report}");
    assert_eq!(report["events"], 180, "{report}");
    assert_eq!(report["database"], Value::Null, "{report}");
    for role in ["produce", "relay", "apply"] {
        assert!(
            report["kills_by_role"][role].as_u64().unwrap_or(0) >= 1,
            "no {role} killed: {report}"
        );
    }
    for role in ["relay", "apply"] {
        assert!(
            report["terminations_by_role"][role].as_u64().unwrap_or(0) >= 1,
            "no {role} connection ended: {report}"
        );
    }
    // Every acknowledged event is checked to be in the outbox (a producer
    // killed between its commit and its record acknowledged fewer).
    let acknowledged = report["acknowledged"].as_u64().unwrap();
    assert!(acknowledged > 0 && acknowledged <= 180, "{report}");
    assert!(report["violations"].as_array().unwrap().is_empty());
    bystander
        .query_one("SELECT 1", &[])
        .expect("the bystander's connection was not ended");
    assert_eq!(databases.now(), databases.before, "a database is left");
}

#[test]
fn flags_go_together_and_a_bad_url_creates_nothing() {
    let mut databases = Watched::start("ordo_soak_");
    let server = pgdb::server();
    // The command's own misuses.
    let own: [(&[&str], &str); 4] = [
        (&["--keep"], "--keep"),
        (
            &["--backend", "postgres", "--url", &server, "--faults"],
            "--faults",
        ),
        (
            &[
                "--backend",
                "postgres",
                "--url",
                &server,
                "--producer-threads",
                "4",
            ],
            "--producer-threads",
        ),
        (&["--relays", "9"], "--relays"),
    ];
    let cases = pgdb::backend_url_misuses(&server, &own);
    refuses_each(&["soak", "--seconds", "1"], &cases);
    assert_eq!(databases.now(), databases.before);
}

#[test]
fn an_unreachable_server_is_exit_1_in_one_line_without_its_password() {
    run(&[
        "soak",
        "--seconds",
        "1",
        "--backend",
        "postgres",
        "--url",
        common::UNREACHABLE_PG,
    ])
    .unreachable_server();
}

/// The URL of a database on the test server.
fn database_url(name: &str) -> String {
    format!("{}/{name}", pgdb::server())
}

#[test]
fn the_end_check_of_a_kept_database_reports_what_was_broken_in_it() {
    let mut databases = Watched::start("ordo_soak_");
    let server = pgdb::server();
    let report = soak_ok(
        2,
        20,
        3,
        &["--backend", "postgres", "--url", &server, "--keep"],
    );
    let kept = report["database"]
        .as_str()
        .expect("the kept database")
        .to_owned();
    let name = kept.rsplit('/').next().unwrap().to_owned();
    assert!(
        name.starts_with("ordo_soak_") && name.ends_with("_kept"),
        "{kept}"
    );
    assert!(databases.now().contains(&name));

    let (events, violations) =
        ordo_lab::soak::check_database(&database_url(&name), 20).expect("check");
    assert_eq!(events, 60);
    assert!(violations.is_empty(), "{violations:?}");

    // Each case on a copy of the finished run's database.
    let cases: [(&str, &str); 8] = [
        (
            "DELETE FROM ordo_consumer.inbox WHERE event_id = 'flow-0000001-2'",
            "lost",
        ),
        (
            "DELETE FROM effect WHERE event_id = 'flow-0000002-3'",
            "effects",
        ),
        (
            "UPDATE ordo_consumer.inbox SET status = 'pending', settled_at_ms = NULL
             WHERE event_id = 'flow-0000001-3'",
            "not applied",
        ),
        (
            "UPDATE projection SET state = 'confirmed', applied_seq = 2 WHERE flow_id = 'flow-0000001'",
            "projection",
        ),
        (
            "UPDATE ordo_consumer.inbox SET body = replace(body, '\"amount\":7', '\"amount\":8')
             WHERE event_id = 'flow-0000001-1'",
            "different body",
        ),
        (
            "UPDATE ordo_producer.relay_head SET lease_owner = 'ghost',
                 lease_backend_pid = pg_backend_pid(), lease_expires_at_ms = 9000000000000
                 WHERE flow_id = 'flow-0000003'",
            "still leased to relay ghost",
        ),
        (
            "DELETE FROM ordo_producer.outbox_head WHERE flow_id = 'flow-0000004'",
            "1 flows have outbox events but no head row",
        ),
        (
            "INSERT INTO ordo_producer.custody_pending (destination, position)
             SELECT 1, position FROM ordo_producer.outbox WHERE event_id = 'flow-0000005-1'",
            "listed pending but accepted",
        ),
    ];
    for (i, (sql, expected)) in cases.into_iter().enumerate() {
        let copy = format!("{name}_case{i}");
        databases
            .client
            .batch_execute(&format!("CREATE DATABASE {copy} TEMPLATE {name}"))
            .expect("copy the kept database");
        // Stays connected while the check runs: the lease case's session.
        let mut corrupter = Client::connect(&database_url(&copy), NoTls).expect("connect");
        corrupter.batch_execute(sql).expect(sql);
        let checked = ordo_lab::soak::check_database(&database_url(&copy), 20);
        drop(corrupter);
        databases
            .client
            .batch_execute(&format!("DROP DATABASE {copy} WITH (FORCE)"))
            .expect("drop the copy");
        let (_, violations) = checked.expect("check");
        assert!(
            violations.iter().any(|v| v.detail.contains(expected)),
            "{sql}: {violations:?} lacks {expected:?}"
        );
    }
    databases
        .client
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .expect("drop the kept database");
}
