//! `ordo soak --topology PxC`: P producer stores and C consumer stores,
//! complete bipartite, on SQLite over HTTP. Producer store `i` is named
//! `p<i>` and has one destination per consumer, `c1` to `cC`, added from
//! the start before any append (its `default` removed); each (producer,
//! destination) pair has a relay process of its own posting to that
//! consumer's `ordo serve`, with a key bound to the producer (the server
//! requires one); each consumer has its applier processes. The kill loop
//! and the convergence are the soak's; the end check is the soak's for
//! every pair, on that producer's namespace at that consumer, and no
//! consumer holds anything of a producer not in the run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use ordo_core::destination::{Custody, DestinationStart};
use ordo_core::{
    DestinationName, InboxStatus, OutboxRecord, ProducerName, ProducerOps, SystemClock,
};
use ordo_reservation::ConsumerRows;
use ordo_sqlite::{OpenOptions, ProducerDb};
use ordo_testkit::check::{Rule, Snapshot, Violation};

use crate::experiment::Backend;
use crate::soak::WORKERS_MAX;
use crate::soak::{check_acks, end_violations, Ended, Role, SoakOptions, Tally, WorkerSpec};
use crate::{internal, LabError};

/// The most producer stores, and the most consumer stores, of a topology.
pub const SIDE_MAX: usize = 4;
/// Producer processes on each producer store, racing on its flows.
const PRODUCERS_PER_STORE: usize = 2;
/// Bytes of each producer's key.
const KEY_BYTES: usize = 32;
/// The applier processes of each consumer when not told.
pub const APPLIERS_DEFAULT: usize = 1;

/// P producer stores and C consumer stores, each in 1..=[`SIDE_MAX`];
/// written `PxC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    /// Producer stores.
    pub producers: usize,
    /// Consumer stores.
    pub consumers: usize,
}

impl Topology {
    /// The topology `text` writes (`PxC`, for example `2x3`), or why not.
    pub fn parse(text: &str) -> Result<Topology, String> {
        let side = |part: &str| {
            let digits = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
            let n = part.parse::<usize>().ok().filter(|_| digits)?;
            (1..=SIDE_MAX).contains(&n).then_some(n)
        };
        let parsed = text
            .split_once('x')
            .and_then(|(p, c)| Some((side(p)?, side(c)?)));
        match parsed {
            Some((producers, consumers)) => Ok(Topology {
                producers,
                consumers,
            }),
            None => Err(format!(
                "must be PxC, P producers and C consumers each an integer in 1..={SIDE_MAX} (for example 2x2)"
            )),
        }
    }

    /// The name of producer store `i` (from 0): `p1`, `p2`, ...
    pub fn producer_name(i: usize) -> ProducerName {
        ProducerName::new(format!("p{}", i + 1)).expect("p<N> is a producer name")
    }

    /// The name of the destination of consumer `k` (from 0), in every
    /// producer store: `c1`, `c2`, ...
    pub fn destination_name(k: usize) -> DestinationName {
        DestinationName::new(format!("c{}", k + 1)).expect("c<N> is a destination name")
    }

    /// Every (producer, consumer) pair, by producer then consumer.
    fn pairs(self) -> impl Iterator<Item = (usize, usize)> {
        (0..self.producers).flat_map(move |i| (0..self.consumers).map(move |k| (i, k)))
    }
}

impl FromStr for Topology {
    type Err = String;

    fn from_str(text: &str) -> Result<Topology, String> {
        Topology::parse(text)
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.producers, self.consumers)
    }
}

/// What a run of a topology reports besides the soak's figures.
#[derive(Debug, Clone)]
pub struct TopologyReport {
    /// The topology run.
    pub topology: Topology,
    /// Each (producer, destination) pair, by producer then destination.
    pub pairs: Vec<PairCount>,
}

/// One (producer, destination) pair once converged: what the producer
/// committed and what that destination's consumer holds of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairCount {
    /// The producer's name.
    pub producer: String,
    /// The destination's name (that of its consumer).
    pub destination: String,
    /// Events the producer committed.
    pub committed: usize,
    /// Events of that producer the consumer's inbox holds.
    pub held: usize,
    /// Of those, applied.
    pub applied: usize,
    /// The consumer's effects of that producer's events.
    pub effects: usize,
}

/// The file of producer store `i` in the run's directory.
fn producer_file(i: usize) -> String {
    format!("producer-{}.db", Topology::producer_name(i))
}

/// The file of consumer store `k` in the run's directory.
fn consumer_file(k: usize) -> String {
    format!("consumer-{}.db", Topology::destination_name(k))
}

/// The key file of producer `i`'s relays: its own key alone.
fn key_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("{}.keys", Topology::producer_name(i)))
}

/// The key file of every server: every producer's key, each bound to it.
fn server_keys(dir: &Path) -> PathBuf {
    dir.join("servers.keys")
}

/// The names of the store files of `topology`.
pub(crate) fn store_files(topology: Topology) -> Vec<String> {
    let producers = (0..topology.producers).map(producer_file);
    producers
        .chain((0..topology.consumers).map(consumer_file))
        .collect()
}

/// The producer stores, the consumer stores and the acks file of each
/// producer store, in `dir`.
pub(crate) fn stores(dir: &Path, topology: Topology) -> (Vec<PathBuf>, Vec<PathBuf>, Vec<PathBuf>) {
    let producers = (0..topology.producers).map(|i| dir.join(producer_file(i)));
    let consumers = (0..topology.consumers).map(|k| dir.join(consumer_file(k)));
    let acks = (0..topology.producers)
        .map(|i| dir.join(format!("acks-{}.log", Topology::producer_name(i))));
    (producers.collect(), consumers.collect(), acks.collect())
}

/// Refuses options that do not go with a topology; nothing is run.
pub(crate) fn check_options(options: &SoakOptions, topology: Topology) -> Result<(), LabError> {
    let usage = |what: &str| Err(LabError::Usage(format!("--topology {topology} {what}")));
    if !matches!(options.backend, Backend::Sqlite) {
        return usage("runs on SQLite only in this release: without --backend postgres");
    }
    if options.transport.hop.is_none() {
        return usage(&format!(
            "relays over HTTP to an `ordo serve` of each consumer: without --transport {}",
            options.transport.name
        ));
    }
    if options.keep {
        return usage("keeps SQLite files with --dir: without --keep");
    }
    if !(1..=WORKERS_MAX).contains(&options.appliers) {
        return usage(&format!(
            "takes --appliers (of each consumer) in 1..={WORKERS_MAX}"
        ));
    }
    if options.relays != topology.producers * topology.consumers {
        return usage("runs one relay per (producer, destination): without --relays");
    }
    Ok(())
}

/// The workers of `topology`, in the order they start: each consumer's
/// server (the relays take its address), then each producer store's
/// producers, the relay of each (producer, destination), and each
/// consumer's appliers.
pub(crate) fn roles(options: &SoakOptions, topology: Topology) -> Vec<WorkerSpec> {
    let consumers = 0..topology.consumers;
    let servers = consumers.clone().map(|k| (Role::Server, 0, k));
    let producers = (0..topology.producers)
        .flat_map(|i| std::iter::repeat_n((Role::Produce, i, 0), PRODUCERS_PER_STORE));
    let relays = topology.pairs().map(|(i, k)| (Role::Relay, i, k));
    let appliers =
        consumers.flat_map(|k| std::iter::repeat_n((Role::Apply, 0, k), options.appliers));
    servers
        .chain(producers)
        .chain(relays)
        .chain(appliers)
        .collect()
}

/// The flags of the relay of producer `i` to consumer `k`, beside its
/// server's address: its destination and its producer's key.
pub(crate) fn relay_flags(dir: &Path, i: usize, k: usize) -> Vec<String> {
    vec![
        "--destination".into(),
        Topology::destination_name(k).to_string(),
        "--key-id".into(),
        Topology::producer_name(i).to_string(),
        "--key-file".into(),
        key_file(dir, i).display().to_string(),
    ]
}

/// The flags of every server: every producer's key, and no request
/// without one.
pub(crate) fn serve_flags(dir: &Path) -> Vec<String> {
    vec![
        "--keys".into(),
        server_keys(dir).display().to_string(),
        "--require-producer-keys".into(),
    ]
}

/// Creates every store of `topology` in `dir` and the key files, before
/// any worker starts: each producer store under its name, with its
/// destinations.
pub(crate) fn create_stores(dir: &Path, topology: Topology) -> Result<(), LabError> {
    let (producers, consumers, _) = stores(dir, topology);
    for (i, path) in producers.iter().enumerate() {
        let options = OpenOptions {
            producer_name: Some(Topology::producer_name(i)),
            ..OpenOptions::default()
        };
        let schema = ordo_reservation::producer_schema();
        let mut producer =
            ProducerDb::open_or_create(path, &schema, Arc::new(SystemClock), &options)?;
        for k in 0..topology.consumers {
            let name = Topology::destination_name(k);
            producer
                .add_destination(&name, DestinationStart::Start)?
                .map_err(internal)?;
        }
        let reason = "one destination per consumer of the soak";
        producer
            .remove_destination(&DestinationName::default_name(), "ordo soak", reason)?
            .map_err(internal)?;
    }
    for path in &consumers {
        ordo_reservation::open_consumer(path)?;
    }
    write_keys(dir, topology)
}

/// A random key for each producer: the servers' file binds each to its
/// producer, and each producer's relays hold their own line only.
fn write_keys(dir: &Path, topology: Topology) -> Result<(), LabError> {
    let mut rng = fastrand::Rng::new();
    let lines: Vec<String> = (0..topology.producers)
        .map(|i| {
            let name = Topology::producer_name(i);
            let secret: String = (0..KEY_BYTES)
                .map(|_| format!("{:02x}", rng.u8(..)))
                .collect();
            format!("{name} {secret} producer={name}\n")
        })
        .collect();
    for (i, line) in lines.iter().enumerate() {
        write_private(&key_file(dir, i), line)?;
    }
    write_private(&server_keys(dir), &lines.concat())
}

/// Writes a new file that only its owner may read, as key files must be.
fn write_private(path: &Path, text: &str) -> Result<(), LabError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| LabError::Internal(format!("cannot create {}: {e}", path.display())))?;
    file.write_all(text.as_bytes())
        .map_err(|e| LabError::Internal(format!("cannot write {}: {e}", path.display())))
}

/// One producer store once converged: its snapshot part and, per event,
/// which destinations hold it.
struct ProducerState {
    name: ProducerName,
    flows: Vec<ordo_reservation::FlowRecord>,
    outbox: Vec<OutboxRecord>,
    /// Per outbox row (in the same order), the destinations that hold it.
    held_by: Vec<BTreeSet<DestinationName>>,
}

fn producer_state(path: &Path, i: usize) -> Result<ProducerState, LabError> {
    let mut producer = ordo_reservation::open_producer(path)?;
    let (flows, outbox) = ordo_reservation::producer_snapshot(&mut producer)?;
    let entries = producer.outbox_entries(false, outbox.len().max(1))?;
    let by_id: BTreeMap<&str, &[Custody]> = (entries.iter())
        .map(|e| (e.envelope.event_id.as_str(), e.destinations.as_slice()))
        .collect();
    let held_by: Vec<BTreeSet<DestinationName>> = (outbox.iter())
        .map(|row| {
            let custody = by_id
                .get(row.envelope.event_id.as_str())
                .copied()
                .unwrap_or_default();
            (custody.iter().filter(|c| c.accepted))
                .map(|c| c.destination.clone())
                .collect()
        })
        .collect();
    Ok(ProducerState {
        name: Topology::producer_name(i),
        flows,
        outbox,
        held_by,
    })
}

/// The snapshot of one (producer, destination) pair: the producer's rows,
/// each accepted when that destination holds it, and the consumer's rows
/// of that producer's namespace.
fn pair_snapshot(producer: &ProducerState, k: usize, consumer: &ConsumerRows) -> Snapshot {
    let destination = Topology::destination_name(k);
    let name = &producer.name;
    let (inbox, projections, effects) = consumer;
    Snapshot {
        flows: producer.flows.clone(),
        outbox: (producer.outbox.iter().zip(&producer.held_by))
            .map(|(row, held_by)| OutboxRecord {
                envelope: row.envelope.clone(),
                accepted: held_by.contains(&destination),
            })
            .collect(),
        inbox: (inbox.iter().filter(|r| &r.envelope.producer == name))
            .cloned()
            .collect(),
        pruned_inbox: Vec::new(),
        projections: (projections.iter().filter(|p| &p.producer == name))
            .cloned()
            .collect(),
        effects: (effects.iter().filter(|e| &e.producer == name))
            .cloned()
            .collect(),
    }
}

/// What consumer `k` holds of a producer that is not in the run.
fn foreign_rows(topology: Topology, k: usize, consumer: &ConsumerRows) -> Vec<Violation> {
    let ours: BTreeSet<ProducerName> = (0..topology.producers)
        .map(Topology::producer_name)
        .collect();
    let (inbox, projections, effects) = consumer;
    let strangers: BTreeSet<&str> = (inbox.iter().map(|r| &r.envelope.producer))
        .chain(projections.iter().map(|p| &p.producer))
        .chain(effects.iter().map(|e| &e.producer))
        .filter(|p| !ours.contains(*p))
        .map(|p| p.as_str())
        .collect();
    strangers
        .into_iter()
        .map(|p| Violation {
            rule: Rule::Extra,
            detail: format!(
                "consumer {}: rows of producer {p}, which is not in the run",
                Topology::destination_name(k)
            ),
        })
        .collect()
}

/// The end check of a topology: for every (producer, destination) pair
/// the soak's end state, its violations naming the pair, and every
/// acknowledged event of each producer in its outbox.
pub(crate) fn end_check(
    dir: &Path,
    topology: Topology,
    flows: u64,
    tally: &mut Tally,
) -> Result<Ended, LabError> {
    let (producers, consumer_paths, acks) = stores(dir, topology);
    let mut consumers = Vec::new();
    for path in &consumer_paths {
        let mut consumer = ordo_reservation::open_consumer(path)?;
        consumers.push(ordo_reservation::consumer_snapshot(&mut consumer)?);
    }
    let mut end_state = Vec::new();
    for (k, consumer) in consumers.iter().enumerate() {
        end_state.extend(foreign_rows(topology, k, consumer));
    }
    let (mut pairs, mut events, mut acknowledged) = (Vec::new(), 0, 0);
    for (i, path) in producers.iter().enumerate() {
        let producer = producer_state(path, i)?;
        let of = format!(" of producer {}", producer.name);
        acknowledged += check_acks(&producer.outbox, &acks[i], &of, tally)?;
        events += producer.outbox.len();
        for (k, consumer) in consumers.iter().enumerate() {
            let snapshot = pair_snapshot(&producer, k, consumer);
            let destination = Topology::destination_name(k);
            let pair = format!("{} to {destination}", producer.name);
            end_state.extend(
                end_violations(&snapshot, flows)?
                    .into_iter()
                    .map(|v| Violation {
                        detail: format!("{pair}: {}", v.detail),
                        ..v
                    }),
            );
            pairs.push(pair_count(&producer, &destination, &snapshot));
        }
    }
    Ok(Ended {
        events,
        acknowledged,
        end_state,
        postgres: None,
        topology: Some(TopologyReport { topology, pairs }),
    })
}

/// The counts of one pair, from its snapshot.
fn pair_count(
    producer: &ProducerState,
    destination: &DestinationName,
    snapshot: &Snapshot,
) -> PairCount {
    PairCount {
        producer: producer.name.to_string(),
        destination: destination.to_string(),
        committed: snapshot.outbox.len(),
        held: snapshot.inbox.len(),
        applied: (snapshot.inbox.iter())
            .filter(|r| r.status == InboxStatus::Applied)
            .count(),
        effects: snapshot.effects.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_core::{relay, FlowId, RelayOptions, SchemaVersion};
    use ordo_reservation::{
        AdvanceRequest, FlowState, Quantity, ReservationHandler, ReservationProducer,
    };

    /// `topology`'s stores in `dir`, two flows of every producer through
    /// all steps, relayed to every destination and applied: converged.
    fn converged(dir: &Path, topology: Topology) {
        create_stores(dir, topology).unwrap();
        let (producers, consumers, _) = stores(dir, topology);
        for path in &producers {
            let mut producer = ordo_reservation::open_producer(path).unwrap();
            for i in 1..=2 {
                let flow = FlowId::new(format!("flow-{i:07}")).unwrap();
                for (seq, to) in [
                    FlowState::Reserved,
                    FlowState::Confirmed,
                    FlowState::Released,
                ]
                .into_iter()
                .enumerate()
                {
                    let quantity = Some(Quantity::new(7).unwrap());
                    let request = AdvanceRequest::new(
                        flow.clone(),
                        seq as i64,
                        to,
                        quantity,
                        SchemaVersion::V1,
                    )
                    .unwrap();
                    producer.advance(&request).unwrap();
                }
            }
            for (k, consumer) in consumers.iter().enumerate() {
                let mut consumer = ordo_reservation::open_consumer(consumer).unwrap();
                let name = Topology::destination_name(k);
                producer.use_destination(Some(&name)).unwrap().unwrap();
                let options = RelayOptions::default();
                relay(&mut producer, &mut consumer, &options, &SystemClock).unwrap();
            }
        }
        for consumer in &consumers {
            let mut consumer = ordo_reservation::open_consumer(consumer).unwrap();
            let mut handler = ReservationHandler::default();
            ordo_core::process_all(&mut consumer, None, &mut handler, 64).unwrap();
        }
    }

    fn checked(dir: &Path, topology: Topology) -> (Ended, Tally) {
        let mut tally = Tally::default();
        let ended = end_check(dir, topology, 2, &mut tally).unwrap();
        (ended, tally)
    }

    #[test]
    fn a_converged_topology_has_no_violation_and_counts_every_pair() {
        let dir = tempfile::tempdir().unwrap();
        let topology = Topology::parse("2x2").unwrap();
        converged(dir.path(), topology);
        let (ended, tally) = checked(dir.path(), topology);
        assert!(ended.end_state.is_empty(), "{:?}", ended.end_state);
        assert!(tally.failures.is_empty(), "{:?}", tally.failures);
        assert_eq!(ended.events, 12);
        let pairs = ended.topology.unwrap().pairs;
        let names: Vec<(&str, &str)> = (pairs.iter())
            .map(|p| (p.producer.as_str(), p.destination.as_str()))
            .collect();
        assert_eq!(
            names,
            [("p1", "c1"), ("p1", "c2"), ("p2", "c1"), ("p2", "c2")]
        );
        for p in &pairs {
            assert_eq!(
                (p.committed, p.held, p.applied, p.effects),
                (6, 6, 6, 6),
                "{p:?}"
            );
        }
    }

    #[test]
    fn each_pair_is_checked_on_its_own() {
        let topology = Topology::parse("2x2").unwrap();
        // The consumer file changed, the SQL, and what the violation says.
        let cases = [
            (
                "c1",
                "DELETE FROM inbox WHERE producer = 'p2' AND event_id = 'flow-0000001-2'",
                "p2 to c1: committed event flow-0000001-2 lost",
            ),
            (
                "c2",
                "DELETE FROM effect WHERE producer = 'p1' AND event_id = 'flow-0000002-3'",
                "p1 to c2: ",
            ),
            (
                "c2",
                "INSERT INTO effect VALUES ('flow-0000001', 'p9', 1, 'flow-0000001-1')",
                "consumer c2: rows of producer p9",
            ),
        ];
        for (consumer, sql, expected) in cases {
            let dir = tempfile::tempdir().unwrap();
            converged(dir.path(), topology);
            let path = dir.path().join(format!("consumer-{consumer}.db"));
            let conn = ordo_sqlite::rusqlite::Connection::open(path).unwrap();
            conn.execute(sql, []).unwrap();
            let (ended, _) = checked(dir.path(), topology);
            let found: Vec<String> = ended.end_state.iter().map(|v| v.to_string()).collect();
            assert!(
                found.iter().any(|v| v.contains(expected)),
                "{sql}: {found:?}"
            );
            let other = if consumer == "c1" { "to c2:" } else { "to c1:" };
            assert!(!found.iter().any(|v| v.contains(other)), "{sql}: {found:?}");
        }
    }

    #[test]
    fn an_acknowledged_event_missing_from_its_producer_is_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let topology = Topology::parse("2x1").unwrap();
        converged(dir.path(), topology);
        std::fs::write(
            dir.path().join("acks-p2.log"),
            "flow-0000001-1\nflow-0000009-1\n",
        )
        .unwrap();
        let (ended, tally) = checked(dir.path(), topology);
        assert_eq!(ended.acknowledged, 2);
        assert_eq!(tally.failures.len(), 1, "{:?}", tally.failures);
        assert!(
            tally.failures[0].contains("flow-0000009-1 of producer p2"),
            "{:?}",
            tally.failures
        );
    }

    #[test]
    fn a_topology_is_p_x_c_each_in_one_to_four() {
        for (text, expected) in [("1x1", (1, 1)), ("2x3", (2, 3)), ("4x4", (4, 4))] {
            let topology = Topology::parse(text).unwrap();
            assert_eq!((topology.producers, topology.consumers), expected, "{text}");
            assert_eq!(topology.to_string(), text);
        }
        for text in [
            "0x2", "5x1", "2x5", "2x", "x2", "axb", "2x2x2", "2*2", "22", "", "+1x1", " 1x1",
            "1x1 ", "2X2", "01x1x", "-1x1", "1x-1",
        ] {
            let refused = Topology::parse(text).unwrap_err();
            assert!(
                refused.contains("PxC") && refused.contains("1..=4"),
                "{text}: {refused}"
            );
        }
    }

    #[test]
    fn every_producer_has_a_relay_to_every_consumer() {
        let topology = Topology::parse("2x3").unwrap();
        let options = SoakOptions {
            exe: "ordo".into(),
            seconds: 1,
            flows: 1,
            seed: None,
            dir: None,
            faults: false,
            transport: crate::transports::by_name("http").unwrap(),
            producer_threads: 1,
            backend: Backend::Sqlite,
            relays: 6,
            appliers: 2,
            keep: false,
            topology: Some(topology),
        };
        crate::soak::check_options(&options).unwrap();
        let specs = roles(&options, topology);
        let of = |role: Role| -> Vec<(usize, usize)> {
            (specs.iter().filter(|s| s.0 == role))
                .map(|s| (s.1, s.2))
                .collect()
        };
        let pairs = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)];
        assert_eq!(of(Role::Relay), pairs);
        assert_eq!(of(Role::Server), [(0, 0), (0, 1), (0, 2)]);
        assert_eq!(of(Role::Produce), [(0, 0), (0, 0), (1, 0), (1, 0)]);
        assert_eq!(of(Role::Apply).len(), 6);
        assert_eq!(specs[0].0, Role::Server, "servers start first");
        let file = SoakOptions {
            transport: crate::transports::by_name("file").unwrap(),
            ..options.clone()
        };
        let postgres = SoakOptions {
            backend: Backend::Postgres {
                url: "postgres://u@127.0.0.1:1".into(),
            },
            ..options.clone()
        };
        let relays = SoakOptions {
            relays: 2,
            ..options
        };
        for (refused, needle) in [
            (file, "--transport file"),
            (postgres, "--backend postgres"),
            (relays, "--relays"),
        ] {
            match crate::soak::check_options(&refused) {
                Err(LabError::Usage(message)) => assert!(message.contains(needle), "{message}"),
                other => panic!("{needle}: {other:?}"),
            }
        }
    }
}
