//! The soak's PostgreSQL side: its stores, opened on the run's database,
//! and the end check of that database once every worker is gone (both
//! sides' rows, the relays' leases, no session of ordo left).

use std::time::{Duration, Instant};

use ordo_core::SystemClock;
use ordo_postgres::{PgConsumer, PgOptions, PgProducer};
use ordo_reservation::postgres::{pg_consumer_snapshot, pg_producer_snapshot};
use ordo_reservation::{consumer_schema, producer_schema};
use ordo_testkit::check::{Rule, Snapshot, Violation};

use crate::pg::Database;
use crate::soak::end_violations;
use crate::LabError;

/// How long the end check waits for the server to see every worker's
/// session gone.
const SESSIONS_GONE_BOUND: Duration = Duration::from_secs(10);

/// The options of the soak's own PostgreSQL stores: ordo's and the
/// domain's tables created when `create`.
fn pg_options(create: bool) -> PgOptions {
    PgOptions {
        create,
        ..PgOptions::default()
    }
}

/// Opens the PostgreSQL producer of a soak's database.
pub(crate) fn pg_producer(url: &str, create: bool) -> Result<PgProducer, LabError> {
    let clock = std::sync::Arc::new(SystemClock);
    Ok(PgProducer::open_with(
        url,
        &producer_schema(),
        clock,
        &pg_options(create),
    )?)
}

/// As [`pg_producer`], for the consumer.
pub(crate) fn pg_consumer(url: &str, create: bool) -> Result<PgConsumer, LabError> {
    let clock = std::sync::Arc::new(SystemClock);
    Ok(PgConsumer::open_with(
        url,
        &consumer_schema(),
        clock,
        &pg_options(create),
    )?)
}

/// Checks the end state of a soak's PostgreSQL database (`url`) once its
/// workers are gone: as [`check_files`](crate::soak::check_files), and every relay lease free (one
/// lease row per flow, none held by a live session). Returns the number of
/// committed events and the violations.
pub fn check_database(url: &str, flows: u64) -> Result<(usize, Vec<Violation>), LabError> {
    let (snapshot, leases) = database_state(url)?;
    let mut violations = end_violations(&snapshot, flows)?;
    violations.extend(leases.violations);
    Ok((snapshot.outbox.len(), violations))
}

/// The relays' leases after convergence. Each flow has one lease row; a
/// lease is free when it names no relay, has expired, or names a relay
/// whose server session is gone (as a claim decides). With every worker
/// gone, each must be free; those still naming a relay were left by a
/// relay that could not release them (killed, or its connection ended).
pub(crate) struct Leases {
    /// Leases still naming a relay, all free.
    pub left: u64,
    /// A lease held by a live session, or flows without a lease row.
    pub violations: Vec<Violation>,
}

/// Both sides of a soak's database, read, and its leases; the list of
/// events not yet accepted must match the outbox.
pub(crate) fn database_state(url: &str) -> Result<(Snapshot, Leases), LabError> {
    let mut producer = pg_producer(url, false)?;
    let snapshot = Snapshot::new(
        pg_producer_snapshot(&mut producer)?,
        pg_consumer_snapshot(&mut pg_consumer(url, false)?)?,
    );
    let (headless, misfiled, held) = producer.read(|tx| {
        let s = tx.ordo_schema().to_owned();
        let counts = tx.query_one(
            &format!(
                "SELECT (SELECT count(DISTINCT o.flow_id) FROM \"{s}\".outbox o
                         WHERE NOT EXISTS (SELECT 1 FROM \"{s}\".outbox_head h
                                           WHERE h.flow_id = o.flow_id)),
                        (SELECT count(*) FROM (
                            (SELECT destination, position FROM \"{s}\".custody_pending
                             EXCEPT SELECT destination, position FROM \"{s}\".custody
                                    WHERE NOT accepted AND NOT abandoned)
                            UNION ALL
                            (SELECT destination, position FROM \"{s}\".custody
                             WHERE NOT accepted AND NOT abandoned
                             EXCEPT SELECT destination, position FROM \"{s}\".custody_pending)) AS d)
                        + (SELECT count(*) FROM \"{s}\".outbox o
                           WHERE o.accepted <> (o.destinations_waiting = 0)
                              OR o.destinations_waiting <> (SELECT count(*)
                                  FROM \"{s}\".custody_pending p WHERE p.position = o.position))"
            ),
            &[],
        )?;
        let held = tx.query(
            &format!(
                "SELECT h.flow_id, h.lease_owner,
                        h.lease_expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                        AND EXISTS (SELECT 1 FROM pg_stat_activity a
                                    WHERE a.pid = h.lease_backend_pid
                                      AND a.datname = current_database())
                 FROM \"{s}\".relay_head h WHERE h.lease_owner IS NOT NULL
                 ORDER BY h.flow_id, h.destination"
            ),
            &[],
        )?;
        let held: Vec<(String, String, bool)> = held
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        Ok((
            counts.get::<_, i64>(0),
            counts.get::<_, i64>(1),
            held,
        ))
    })?;
    let mut violations = Vec::new();
    if misfiled > 0 {
        violations.push(Violation {
            rule: Rule::Unfinished,
            detail: format!(
                "{misfiled} outbox events listed pending but accepted or gone, or not accepted and unlisted, or with a count of destinations waiting that their marks do not match"
            ),
        });
    }
    if headless > 0 {
        violations.push(Violation {
            rule: Rule::Unfinished,
            detail: format!("{headless} flows have outbox events but no head row"),
        });
    }
    for (flow, owner, _) in held.iter().filter(|(_, _, live)| *live) {
        violations.push(Violation {
            rule: Rule::Unfinished,
            detail: format!(
                "flow {flow} is still leased to relay {owner}, whose session is alive after every worker finished"
            ),
        });
    }
    let left = held.iter().filter(|(_, _, live)| !live).count() as u64;
    Ok((snapshot, Leases { left, violations }))
}

/// Waits until the server sees none of ordo's sessions in the run's
/// database (every worker has exited); a session still there after
/// [`SESSIONS_GONE_BOUND`] is a violation.
pub(crate) fn sessions_gone(database: &Database) -> Result<Vec<Violation>, LabError> {
    let started = Instant::now();
    loop {
        let sessions = database.ordo_sessions()?;
        if sessions.is_empty() {
            return Ok(Vec::new());
        }
        if started.elapsed() > SESSIONS_GONE_BOUND {
            let names: Vec<&str> = sessions.iter().map(|(_, name)| name.as_str()).collect();
            return Ok(vec![Violation {
                rule: Rule::Unfinished,
                detail: format!(
                    "sessions still connected after every worker finished: {}",
                    names.join(", ")
                ),
            }]);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
