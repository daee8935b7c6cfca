//! The hidden worker roles of multi-process scenarios and soaks: each is
//! one long-running `ordo` process doing what a producer, relay or applier
//! service would do. Also the wrong control `unsafe_dual_write`, which no
//! safe path calls.

use ordo_reservation::{
    consumer_schema, producer_schema, Advance, AdvanceError, AdvanceRequest, FlowState, Quantity,
    ReservationHandler, ReservationProducer,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ordo_core::StoreError;
use ordo_core::{
    process_all, relay, ApplyHandler, Backoff, Clock, ConsumerStore, DestinationName, ErrorKind,
    FlowId, ProducerStore, RelayError, RelayOptions, SchemaVersion, SystemClock, Transport,
};
use ordo_http::{ClientOptions, HttpTransport, KeyRing, Signer};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};

use crate::LabError as Failure;

/// The pause of an idle relay or applier before it looks again.
const IDLE_PAUSE: Duration = Duration::from_millis(5);
/// Deliveries per relay round.
const RELAY_ROUND_LEN: u64 = 64;
/// The most events of one flow in a relay round.
const RELAY_ROUND_FLOW_EVENTS_MAX: usize = 4;
/// Events per apply transaction.
const APPLY_BATCH_LEN: u64 = 64;
/// How long a relay worker's request to an HTTP inbox may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// The backoff of a relay worker over HTTP or to a PostgreSQL consumer,
/// whose failures are brief (a restarted server, an ended connection).
const SHORT_BACKOFF: Backoff = Backoff {
    base_ms: 10,
    cap_ms: 250,
    floor_ms: 0,
};

/// The exit status of the wrong control `unsafe_dual_write`, between its
/// two transactions.
pub const UNSAFE_EXIT_STATUS: i32 = 81;

/// What one worker process does.
#[derive(Debug, Clone)]
pub enum WorkerRole {
    /// Advances every flow through all three steps, racing other producers.
    Produce {
        /// The producer file.
        producer: PathBuf,
        /// The flows.
        flows: Vec<FlowId>,
        /// The quantity of every flow.
        quantity: Quantity,
        /// Flow by flow over this window (ms since the epoch) instead of
        /// step by step at once.
        spread_ms: Option<(i64, i64)>,
        /// Appends the id of every event acknowledged as committed, one
        /// line each, after the acknowledgement.
        acks: Option<PathBuf>,
    },
    /// Advances every flow through all three steps with many threads
    /// through one group-committing writer, racing other producers.
    ProduceGrouped(crate::worker_group::GroupedProduce),
    /// Relays until the marker file exists and nothing is left.
    Relay {
        /// The producer file.
        producer: PathBuf,
        /// The destination relayed for (`None`: the store's only one).
        destination: Option<DestinationName>,
        /// Where the events go.
        target: RelayTarget,
        /// The marker file.
        until: PathBuf,
    },
    /// Applies until the marker file exists and nothing is left.
    Apply {
        /// The consumer file.
        consumer: PathBuf,
        /// The marker file.
        until: PathBuf,
    },
    /// The wrong control: the flow's state and its event in two
    /// transactions, the process exiting with [`UNSAFE_EXIT_STATUS`] between
    /// them.
    UnsafeDualWrite {
        /// The producer file.
        producer: PathBuf,
        /// The flow.
        flow: FlowId,
        /// Its quantity.
        quantity: Quantity,
    },
}

/// Where a relay worker hands its events.
#[derive(Debug, Clone)]
pub enum RelayTarget {
    /// The consumer file, opened in the worker.
    File(PathBuf),
    /// The HTTP inbox of an `ordo serve` at this base URL, the requests
    /// signed with a key if one is given.
    Http {
        /// The base URL.
        url: String,
        /// The key that signs the requests.
        key: Option<RelayKey>,
    },
}

/// The key a relay worker signs its HTTP requests with: its id in a key
/// file (`KEY_ID SECRET_HEX [producer=NAME]` lines).
#[derive(Debug, Clone)]
pub struct RelayKey {
    /// The key id.
    pub id: String,
    /// The key file.
    pub file: PathBuf,
}

/// The flows `flow-0000001` to `flow-N`, as the soak's producers drive them.
pub fn counted_flows(count: u64) -> Result<Vec<FlowId>, Failure> {
    (1..=count)
        .map(|i| FlowId::new(format!("flow-{i:07}")).map_err(|e| Failure::Usage(e.rule)))
        .collect()
}

/// How a worker opens its stores: the clock and options of its process.
#[derive(Clone)]
pub struct WorkerEnv {
    /// The clock of the process.
    pub clock: Arc<dyn Clock>,
    /// The options of every store it opens.
    pub options: OpenOptions,
}

impl WorkerEnv {
    fn producer(&self, path: &Path) -> Result<ProducerDb, Failure> {
        let schema = producer_schema();
        Ok(ProducerDb::open_or_create(
            path,
            &schema,
            self.clock.clone(),
            &self.options,
        )?)
    }

    fn consumer(&self, path: &Path) -> Result<ConsumerDb, Failure> {
        let schema = consumer_schema();
        Ok(ConsumerDb::open_or_create(
            path,
            &schema,
            self.clock.clone(),
            &self.options,
        )?)
    }

    /// Opens a PostgreSQL producer, opening again while the server ends
    /// the connection (see [`Retries::POSTGRES`]).
    fn pg_producer(&self, url: &str) -> Result<PgProducer, Failure> {
        let schema = producer_schema();
        Retries::postgres()
            .run(|| PgProducer::open_with(url, &schema, self.clock.clone(), &PgOptions::default()))
    }

    /// As [`WorkerEnv::pg_producer`], for a consumer.
    fn pg_consumer(&self, url: &str) -> Result<PgConsumer, Failure> {
        let schema = consumer_schema();
        Retries::postgres()
            .run(|| PgConsumer::open_with(url, &schema, self.clock.clone(), &PgOptions::default()))
    }
}

/// The URL a `--producer` or `--consumer` value is when it names a
/// PostgreSQL database (it starts with `postgres://` or `postgresql://`);
/// anything else is an SQLite file.
fn postgres_url(store: &Path) -> Option<&str> {
    store.to_str().filter(|s| ordo_postgres::is_postgres_url(s))
}

/// What a worker did before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerReport {
    /// Steps committed, and steps another producer had already committed.
    Produced {
        /// Committed by this worker.
        committed: u64,
        /// Found done (`stale`).
        stale: u64,
    },
    /// Events handed to the consumer.
    Relayed {
        /// Deliveries made.
        delivered: u64,
    },
    /// Events applied.
    Applied {
        /// Events applied.
        applied: u64,
    },
}

/// Runs one worker role to its end. The wrong control never returns: its
/// process exits between its two transactions.
pub fn run(role: WorkerRole, env: &WorkerEnv) -> Result<WorkerReport, Failure> {
    // A soak with faults arms one in this process; it stays armed for the
    // whole run.
    let _fault = crate::faults::arm_from_env()?;
    match role {
        WorkerRole::Produce {
            producer,
            flows,
            quantity,
            spread_ms,
            acks,
        } => {
            let job = Production {
                flows: &flows,
                quantity,
                spread: spread_ms,
                acks: crate::worker_group::Acks::open(acks.as_deref())?,
            };
            match postgres_url(&producer) {
                Some(url) => produce(&mut env.pg_producer(url)?, &job, Retries::postgres()),
                None => produce(&mut env.producer(&producer)?, &job, Retries::sqlite()),
            }
        }
        WorkerRole::ProduceGrouped(job) => crate::worker_group::produce(env, &job),
        WorkerRole::Relay {
            producer,
            destination,
            target,
            until,
        } => {
            let job = Relaying {
                destination,
                target,
                until,
            };
            match postgres_url(&producer) {
                Some(url) => {
                    relay_until(env, &mut env.pg_producer(url)?, &job, Retries::postgres())
                }
                None => relay_until(env, &mut env.producer(&producer)?, &job, Retries::sqlite()),
            }
        }
        WorkerRole::Apply { consumer, until } => match postgres_url(&consumer) {
            Some(url) => apply_until(&mut env.pg_consumer(url)?, &until, Retries::postgres()),
            None => apply_until(&mut env.consumer(&consumer)?, &until, Retries::sqlite()),
        },
        WorkerRole::UnsafeDualWrite {
            producer,
            flow,
            quantity,
        } => match postgres_url(&producer) {
            Some(url) => unsafe_dual_write_pg(env, url, &flow, quantity),
            None => unsafe_dual_write(env, &producer, &flow, quantity),
        },
    }
}

/// What a single-threaded producer worker drives.
struct Production<'a> {
    flows: &'a [FlowId],
    quantity: Quantity,
    spread: Option<(i64, i64)>,
    acks: crate::worker_group::Acks,
}

/// Advances every flow through all three steps, each step with the
/// `expected_seq` of that step: when another producer won the race the
/// outcome is `stale` and the step is already done. A step that failed
/// with a kind `retries` allows is tried again: the `expected_seq` makes
/// that safe (a step that did commit is found `stale`).
fn produce(
    producer: &mut impl ReservationProducer,
    job: &Production<'_>,
    mut retries: Retries,
) -> Result<WorkerReport, Failure> {
    let (mut committed, mut stale) = (0u64, 0u64);
    let (flows, quantity, spread) = (job.flows, job.quantity, job.spread);
    let steps = [
        FlowState::Reserved,
        FlowState::Confirmed,
        FlowState::Released,
    ];
    let mut advance = |flow: &FlowId, expected_seq: usize, to: FlowState| -> Result<(), Failure> {
        let request = AdvanceRequest::new(
            flow.clone(),
            expected_seq as i64,
            to,
            Some(quantity),
            SchemaVersion::V1,
        )
        .map_err(|e| Failure::Usage(e.to_string()))?;
        loop {
            match producer.advance(&request) {
                Ok(Advance::Committed(event)) => {
                    committed += 1;
                    job.acks.record(event.event_id.as_str())?;
                }
                Ok(Advance::Stale { .. }) => stale += 1,
                Ok(other) => {
                    return Err(Failure::Internal(format!("{flow}: unexpected {other:?}")))
                }
                Err(AdvanceError::Store(e)) if retries.allows(&e) => {
                    retries.retry(e)?;
                    continue;
                }
                Err(AdvanceError::Store(e)) => return Err(e.into()),
                Err(e) => return Err(Failure::Internal(e.to_string())),
            }
            retries.reset();
            return Ok(());
        }
    };
    match spread {
        // Step by step across all flows: racing producers meet on every step.
        None => {
            for (expected_seq, to) in steps.into_iter().enumerate() {
                for flow in flows {
                    advance(flow, expected_seq, to)?;
                }
            }
        }
        // Flow by flow on a schedule shared by every producer of the run, so
        // that a restarted producer takes up where the schedule is.
        Some((from_ms, until_ms)) => {
            let per_flow_ms = (until_ms - from_ms).max(0) as f64 / flows.len().max(1) as f64;
            for (i, flow) in flows.iter().enumerate() {
                let due_ms = from_ms + (per_flow_ms * i as f64) as i64;
                let wait_ms = due_ms - SystemClock.now_ms();
                if wait_ms > 0 {
                    std::thread::sleep(Duration::from_millis(wait_ms as u64));
                }
                for (expected_seq, to) in steps.into_iter().enumerate() {
                    advance(flow, expected_seq, to)?;
                }
            }
        }
    }
    Ok(WorkerReport::Produced { committed, stale })
}

/// Counts consecutive failures of the kinds a worker retries; past the
/// limit the worker gives up with the error, as a service would report it.
struct Retries {
    count: u32,
    kinds: &'static [ErrorKind],
}

impl Retries {
    /// Consecutive failures tolerated before giving up.
    const MAX: u32 = 1_000;
    /// On SQLite: another writer held the lock past the busy timeout.
    const SQLITE: &'static [ErrorKind] = &[ErrorKind::Busy];
    /// On PostgreSQL also a connection that the server ended, or a COMMIT
    /// whose answer it lost: the store replaces the connection before its
    /// next transaction, and every step a worker takes (a conditional
    /// advance, a receive, a relay's bookkeeping, an apply) is idempotent
    /// or conditional, so trying it again is safe.
    const POSTGRES: &'static [ErrorKind] = &[
        ErrorKind::Busy,
        ErrorKind::ConnectionLost,
        ErrorKind::CommitOutcomeUnknown,
    ];

    fn sqlite() -> Retries {
        Retries {
            count: 0,
            kinds: Self::SQLITE,
        }
    }

    fn postgres() -> Retries {
        Retries {
            count: 0,
            kinds: Self::POSTGRES,
        }
    }

    /// Whether `error` is of a kind tried again.
    fn allows(&self, error: &StoreError) -> bool {
        self.kinds.contains(&error.kind())
    }

    /// Pauses before the next try, or gives up with `error` past
    /// [`Retries::MAX`] in a row.
    fn retry(&mut self, error: StoreError) -> Result<(), Failure> {
        self.count += 1;
        if self.count > Self::MAX {
            return Err(error.into());
        }
        std::thread::sleep(IDLE_PAUSE);
        Ok(())
    }

    /// A success: the count starts again.
    fn reset(&mut self) {
        self.count = 0;
    }

    /// Runs `f` until it succeeds or fails otherwise than [`Retries::allows`].
    fn run<T>(mut self, mut f: impl FnMut() -> Result<T, StoreError>) -> Result<T, Failure> {
        loop {
            match f() {
                Ok(value) => return Ok(value),
                Err(e) if self.allows(&e) => self.retry(e)?,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The transport to `target` and the relay options that go with it: over
/// HTTP and to PostgreSQL a short backoff, since a restarted server or a
/// new connection is back within milliseconds and the soak's convergence
/// waits for every event.
fn open_target(
    env: &WorkerEnv,
    target: &RelayTarget,
) -> Result<(Box<dyn Transport>, RelayOptions), Failure> {
    // Deep rounds, so that SIGKILLs and ended connections also meet rounds
    // holding several events of a flow.
    let options = RelayOptions {
        max: Some(RELAY_ROUND_LEN),
        flow_events_max: RELAY_ROUND_FLOW_EVENTS_MAX,
        ..RelayOptions::default()
    };
    match target {
        RelayTarget::File(path) => match postgres_url(path) {
            // A connection the server ended is replaced at the next
            // receive: the events it failed back off briefly.
            Some(url) => Ok((
                Box::new(env.pg_consumer(url)?),
                RelayOptions {
                    backoff: SHORT_BACKOFF,
                    ..options
                },
            )),
            None => Ok((Box::new(env.consumer(path)?), options)),
        },
        RelayTarget::Http { url, key } => {
            let client = ClientOptions {
                timeout: HTTP_TIMEOUT,
                connect_timeout: HTTP_TIMEOUT,
                ca_pem: None,
            };
            let signer = key.as_ref().map(signer).transpose()?;
            let transport = HttpTransport::new(url, signer, &client)
                .map_err(|e| Failure::Usage(e.to_string()))?;
            Ok((
                Box::new(transport),
                RelayOptions {
                    backoff: SHORT_BACKOFF,
                    ..options
                },
            ))
        }
    }
}

/// The signer of `key`, read from its file.
fn signer(key: &RelayKey) -> Result<Signer, Failure> {
    let ring = KeyRing::load(&key.file).map_err(|e| Failure::Usage(e.to_string()))?;
    Signer::new(&key.id, ring).map_err(|e| Failure::Usage(e.to_string()))
}

/// What a relay worker relays: for which destination, to where, until
/// which marker file exists.
struct Relaying {
    destination: Option<DestinationName>,
    target: RelayTarget,
    until: PathBuf,
}

/// Whether every event of `destination` (the store's only one if `None`)
/// that is not quarantined has been accepted.
fn settled(
    producer: &mut impl ProducerStore,
    destination: Option<&DestinationName>,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let status = match destination {
        None => producer.producer_status(now_ms)?,
        Some(name) => (producer.destinations(now_ms)?.into_iter())
            .find(|d| &d.name == name)
            .map(|d| d.status)
            .ok_or_else(|| {
                StoreError::new(ErrorKind::Other, format!("no destination {name} any more"))
            })?,
    };
    Ok(status.backlog == status.quarantined)
}

/// Relays until the job's marker file exists and every event of its
/// destination that is not quarantined has been accepted (events still
/// backing off are waited for).
fn relay_until(
    env: &WorkerEnv,
    producer: &mut impl ProducerStore,
    job: &Relaying,
    mut retries: Retries,
) -> Result<WorkerReport, Failure> {
    if let Some(name) = &job.destination {
        let choosing = Retries {
            count: 0,
            kinds: retries.kinds,
        };
        choosing
            .run(|| producer.use_destination(Some(name)))?
            .map_err(|e| Failure::Usage(e.to_string()))?;
    }
    let (until, destination) = (&job.until, job.destination.as_ref());
    let (mut transport, options) = open_target(env, &job.target)?;
    let clock = env.clock.clone();
    let mut delivered = 0u64;
    loop {
        let finishing = until.exists();
        let report = match relay(producer, transport.as_mut(), &options, clock.as_ref()) {
            Ok(report) => report,
            Err(RelayError::Store(e)) if retries.allows(&e) => {
                retries.retry(e)?;
                continue;
            }
            // The round's failure is not recorded: its events are simply
            // due again.
            Err(RelayError::FailureUnrecorded { recording, .. }) if retries.allows(&recording) => {
                retries.retry(recording)?;
                continue;
            }
            Err(RelayError::Store(e)) => return Err(e.into()),
            Err(e) => return Err(Failure::Internal(e.to_string())),
        };
        retries.reset();
        delivered += report.deliveries.len() as u64;
        if report.deliveries.is_empty() {
            if finishing {
                match settled(producer, destination, clock.now_ms()) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) if retries.allows(&e) => {
                        retries.retry(e)?;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            std::thread::sleep(IDLE_PAUSE);
        }
    }
    Ok(WorkerReport::Relayed { delivered })
}

/// Applies until `until` exists and a round after that applies nothing.
fn apply_until<C>(
    consumer: &mut C,
    until: &Path,
    mut retries: Retries,
) -> Result<WorkerReport, Failure>
where
    C: ConsumerStore,
    ReservationHandler: ApplyHandler<C::Tx>,
{
    let mut applied = 0u64;
    loop {
        let finishing = until.exists();
        let drains = match process_all(
            consumer,
            None,
            &mut ReservationHandler::default(),
            APPLY_BATCH_LEN,
        ) {
            Ok(drains) => drains,
            Err(e) if retries.allows(&e) => {
                retries.retry(e)?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        retries.reset();
        let round: u64 = drains.iter().map(|d| d.applied).sum();
        applied += round;
        if round == 0 {
            if finishing {
                break;
            }
            std::thread::sleep(IDLE_PAUSE);
        }
    }
    Ok(WorkerReport::Applied { applied })
}

/// THE WRONG CONTROL. Commits the flow's new state in one transaction, then
/// exits with status 81 before the transaction that would have recorded the
/// event: the state has moved and the event is lost. It exists only to show
/// the failure that `advance` prevents.
fn unsafe_dual_write(
    env: &WorkerEnv,
    path: &Path,
    flow: &FlowId,
    quantity: Quantity,
) -> Result<WorkerReport, Failure> {
    let mut producer = env.producer(path)?;
    producer.write(|tx| -> Result<(), ordo_core::StoreError> {
        tx.sql()
            .execute(
                "INSERT INTO flow (flow_id, state, quantity) VALUES (?1, 'reserved', ?2)",
                ordo_sqlite::rusqlite::params![flow.as_str(), quantity.get()],
            )
            .map_err(|e| {
                ordo_core::StoreError::with_source(ErrorKind::Other, "unsafe_dual_write", e)
            })?;
        Ok(())
    })?;
    std::process::exit(UNSAFE_EXIT_STATUS);
}

/// THE WRONG CONTROL on a PostgreSQL producer: as [`unsafe_dual_write`].
fn unsafe_dual_write_pg(
    env: &WorkerEnv,
    url: &str,
    flow: &FlowId,
    quantity: Quantity,
) -> Result<WorkerReport, Failure> {
    let mut producer = env.pg_producer(url)?;
    producer.write(|tx| -> Result<u64, ordo_core::StoreError> {
        tx.sql().execute(
            "INSERT INTO flow (flow_id, state, quantity) VALUES ($1, 'reserved', $2)",
            &[&flow.as_str(), &quantity.get()],
        )
    })?;
    std::process::exit(UNSAFE_EXIT_STATUS);
}
