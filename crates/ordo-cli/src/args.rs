//! The command-line contract of `docs/CLI.md`, as clap types. Every
//! value is validated here, before any database is opened.

#[allow(unused_imports)]
use ordo_reservation::{FlowState, Quantity};
use std::path::PathBuf;
use std::sync::LazyLock;

use clap::{Args, Parser, Subcommand};
use ordo_lab::transports::{LabTransport, TRANSPORTS};

use crate::stores::Location;
use ordo_core::{EventId, FlowId, SchemaVersion, Seq};

/// ordo: ordered transactional outbox / inbox messaging.
///
/// A producer records each event in the same transaction as the state
/// change it describes; a relay hands the events to a consumer, which stores
/// them durably (deduplicating, detecting conflicts) and applies each flow's
/// events strictly in order, exactly once in effect, across crashes at any
/// instant. Each side is a SQLite file (WAL, synchronous=FULL) or a
/// PostgreSQL database (a postgres:// or postgresql:// URL). Every
/// command takes --json; exit status 0 for any protocol outcome, 2 for
/// invalid input (nothing written), 1 for a storage error.
#[derive(Debug, Parser)]
#[command(name = "ordo", version, propagate_version = true)]
pub struct Cli {
    /// Print exactly one JSON document on stdout instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    /// How long a write waits for another writer's lock, in milliseconds.
    #[arg(long, global = true, value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000), allow_hyphen_values = true)]
    pub busy_timeout_ms: u64,

    /// How logs are written on stderr (level from RUST_LOG; default info for
    /// long-running modes, warn otherwise).
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// The two stores.
#[derive(Debug, Args)]
pub struct Files {
    /// The producer store: an SQLite file or a postgres:// URL (flows and outbox).
    #[arg(long, value_name = "P")]
    pub producer: Location,
    /// The consumer store: an SQLite file or a postgres:// URL (inbox, projection, effects).
    #[arg(long, value_name = "C")]
    pub consumer: Location,
}

/// One database file or both: commands that operate each side alone.
#[derive(Debug, Args)]
#[group(required = true, multiple = true)]
pub struct Sides {
    /// The producer store, an SQLite file or a postgres:// URL (outbox, and
    /// the domain's producer tables).
    #[arg(long, value_name = "P")]
    pub producer: Option<Location>,
    /// The consumer store, an SQLite file or a postgres:// URL (inbox, and
    /// the domain's consumer tables).
    #[arg(long, value_name = "C")]
    pub consumer: Option<Location>,
}

impl Sides {
    /// Both files, when both are given.
    pub fn both(&self) -> Option<Files> {
        Some(Files {
            producer: self.producer.clone()?,
            consumer: self.consumer.clone()?,
        })
    }
}

#[derive(Debug, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub sides: Sides,
    /// The domain a missing store is created for (default: reservation);
    /// an existing store of another domain is refused.
    #[arg(long, value_name = "NAME")]
    pub domain: Option<ordo_core::DomainName>,
    /// Install ordo's tables into an existing SQLite database of the
    /// application's (beside its own tables) instead of refusing it.
    #[arg(long)]
    pub adopt: bool,
    /// The name a new producer store is created with (default: default):
    /// its namespace in every inbox it delivers to. An existing producer
    /// store of another name is refused; a name never changes.
    #[arg(long, value_name = "NAME")]
    pub producer_name: Option<ordo_core::ProducerName>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the stores and their tables if missing (one side or both); never resets state.
    Init(InitArgs),
    /// Advance a flow by one step: state change and event in one transaction.
    Advance(AdvanceArgs),
    /// Hand unaccepted outbox events to the consumer and mark them accepted.
    Relay(RelayArgs),
    /// Store envelopes read from stdin in the inbox, all in one transaction.
    Receive(ReceiveArgs),
    /// Apply stored events in order, per flow.
    Apply(ApplyArgs),
    /// Print every row of the given stores (one side or both).
    Snapshot(Sides),
    /// Run N flows through all three steps on two fresh SQLite files and check the end state.
    Demo(DemoArgs),
    /// Run the protocol's 22 scenarios, 6 beyond them, 2 of the HTTP transport and 5 of many producers and consumers on real processes; compare every state.
    ///
    /// The groups, reported apart: `seed`, the protocol's 22 (PROTOCOL.md
    /// section 10); `beyond`, fairness, backoff, quarantine, skip, prune and
    /// alerts; `transport`, crashes over HTTP; `topology`, a conflict that
    /// stops its flow in one delivery, two named producers sharing flow
    /// ids, fan-out with one consumer down, a key bound to another
    /// producer, and a producer restored from a backup.
    Experiment(ExperimentArgs),
    /// Kill producers, relays and appliers at random, converge, check the invariants.
    Soak(SoakArgs),
    /// Measure throughput per phase and end to end against the disk's fsync rate.
    Bench(BenchArgs),
    /// Add, list and remove the producer store's destinations.
    Destination {
        #[command(subcommand)]
        command: crate::destinations::DestinationCommand,
    },
    /// List the consumer's effect intents, run the webhook executor, retry, resolve or skip an intent.
    Effects {
        #[command(subcommand)]
        command: crate::effects::EffectsCommand,
    },
    /// Inspect the outbox and retry quarantined events.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Inspect the inbox, re-evaluate blocked rows, skip with an audit trail.
    Inbox {
        #[command(subcommand)]
        command: InboxCommand,
    },
    /// Alerting signals of both files; exit 3 when a given threshold is breached.
    Status(StatusArgs),
    /// Remove delivered outbox rows and settled inbox rows older than a duration.
    Prune(PruneArgs),
    /// Serve the consumer's inbox over HTTP (HTTP.md) until SIGTERM or SIGINT.
    Serve(ServeArgs),
    /// Serve the operator web console (one side or both) until SIGTERM or SIGINT.
    Console(ConsoleArgs),
    /// A long-running role for multi-process scenarios (used by experiment and soak).
    #[command(hide = true)]
    Worker {
        #[command(subcommand)]
        role: WorkerCommand,
    },
}

/// The format of the logs on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The consumer store, an SQLite file or a postgres:// URL (never created here).
    #[arg(long, value_name = "C")]
    pub consumer: Location,
    /// The address to listen on, IP:PORT (port 0 picks a free port; the
    /// first stdout line names the bound address).
    #[arg(long, value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// The key file (lines `KEY_ID SECRET_HEX [producer=NAME]`, readable by
    /// its owner only); every POST must then be signed, and a key bound to a
    /// producer may deliver only that producer's envelopes.
    #[arg(long, value_name = "FILE")]
    pub keys: Option<PathBuf>,
    /// Refuse to start unless --keys is given and binds every key to a
    /// producer (`producer=NAME`).
    #[arg(long)]
    pub require_producer_keys: bool,
    /// Also run the reservation domain's applier in this process.
    #[arg(long)]
    pub apply: bool,
    /// With --apply, record for every applied event a `webhook` effect
    /// intent posting it to URL (http or https).
    #[arg(long, value_name = "URL", requires = "apply", value_parser = ordo_http::webhook::check_url)]
    pub webhook: Option<String>,
    /// The most envelopes of one request, 1..=100000.
    #[arg(long, value_name = "N", default_value_t = ordo_http::server::MAX_BATCH_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_batch: u64,
    /// The largest request body in bytes, 1..=1073741824.
    #[arg(long, value_name = "B", default_value_t = ordo_http::server::MAX_BODY_BYTES_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=1_073_741_824))]
    pub max_body_bytes: u64,
    /// The most requests in flight; more are answered 503, 1..=10000.
    #[arg(long, value_name = "N", default_value_t = ordo_http::server::MAX_IN_FLIGHT_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_in_flight: u64,
    /// The most open connections; more are closed at once, 1..=1000000.
    #[arg(long, value_name = "N", default_value_t = ordo_http::server::MAX_CONNECTIONS_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// How long a request head, a body or a TLS handshake may take, and how
    /// long an idle connection stays open, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = ordo_http::server::READ_TIMEOUT_DEFAULT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub read_timeout_ms: u64,
    /// Serve HTTPS with this certificate chain (PEM); requires --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Allow unsigned requests on an address other than loopback.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

#[derive(Debug, Args)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub sides: Sides,
    /// The address to listen on, IP:PORT (port 0 picks a free port; the
    /// first stdout line names the bound address). An address other than
    /// loopback needs --token-file.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7080")]
    pub listen: std::net::SocketAddr,
    /// Show no action.
    #[arg(long)]
    pub read_only: bool,
    /// The operator token file (its first line; readable by its owner
    /// only): every page then needs a login with the token.
    #[arg(long, value_name = "F")]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ExperimentArgs {
    /// Exit non-zero when any scenario differs from its expectation.
    #[arg(long)]
    pub check: bool,
    /// Write the full report (observed and expected of every scenario) as JSON.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Compare against the `expected` values of this report instead of the built-in ones.
    #[arg(long, value_name = "FILE")]
    pub expected: Option<PathBuf>,
    /// Run only this scenario (repeatable).
    #[arg(long, value_name = "NAME")]
    pub only: Vec<String>,
    /// Where the scenarios' stores live: two SQLite files each, or a fresh
    /// PostgreSQL database each on the server of `--url`.
    #[arg(long, value_enum, value_name = "B", default_value = "sqlite")]
    pub backend: BackendArg,
    /// The PostgreSQL server of `--backend postgres` (`postgres://USER@HOST:PORT`;
    /// a database in it is only where the run connects to create the others).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
}

/// The storage backend of a lab run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// SQLite files.
    Sqlite,
    /// PostgreSQL databases.
    Postgres,
}

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// How long to keep killing workers, in seconds (1..=86400).
    #[arg(long, value_name = "S", default_value = "20",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub seconds: u64,
    /// How many flows the producers drive through all three steps (1..=1000000).
    #[arg(long, value_name = "N", default_value = "200",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub flows: u64,
    /// Seed of the kill schedule (default: random, printed in the result).
    #[arg(long, value_name = "K")]
    pub seed: Option<u64>,
    /// Keep the files in this new directory instead of a temporary one.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Also inject I/O errors, full-disk errors and failed syncs into half
    /// of the workers started, at a random write or sync.
    #[arg(long)]
    pub faults: bool,
    /// How the relays reach the consumer: `file` opens it, `http` posts to
    /// an `ordo serve` on the loopback interface, which is killed too
    /// (default: file; http with --topology, which takes no other).
    #[arg(long, value_enum, value_name = "T")]
    pub transport: Option<SoakTransportArg>,
    /// Threads in each producer process (1..=1024): more than one share a
    /// group-committing writer, and every event acknowledged to them is
    /// checked to be in the outbox at the end.
    #[arg(long, value_name = "N", default_value = "1",
          value_parser = clap::value_parser!(u64).range(1..=1_024))]
    pub producer_threads: u64,
    /// Where the run's stores live: two SQLite files, or one fresh
    /// PostgreSQL database (both roles' schemas) on the server of `--url`,
    /// dropped afterwards.
    #[arg(long, value_enum, value_name = "B", default_value = "sqlite")]
    pub backend: BackendArg,
    /// The PostgreSQL server of `--backend postgres` (`postgres://USER@HOST:PORT`;
    /// a database in it is only where the run connects to create its own).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Relay processes, 1..=8 (default: 2 on sqlite, 4 on postgres).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=8))]
    pub relays: Option<u64>,
    /// Applier processes, 1..=8 (default: 2 on sqlite, 4 on postgres).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=8))]
    pub appliers: Option<u64>,
    /// With --backend postgres, keep the run's database (named in the
    /// result) instead of dropping it.
    #[arg(long)]
    pub keep: bool,
    /// P producer stores and C consumer stores (each 1..=4), every
    /// producer with one destination per consumer, one relay per
    /// (producer, destination) over HTTP; SQLite only. --appliers is then
    /// per consumer (default 1).
    #[arg(long, value_name = "PxC", allow_hyphen_values = true,
          value_parser = ordo_lab::soak_topology::Topology::parse)]
    pub topology: Option<ordo_lab::soak_topology::Topology>,
    /// External effects: the consumer of each of two destinations, `dedup`
    /// and `plain`, applied by `apply --follow --webhook` to a fake provider
    /// of that name run by the soak, its intents executed by `effects run
    /// --follow` (killed too), then checked; SQLite, file relays. --appliers
    /// is then per consumer (default 1).
    #[arg(long)]
    pub effects: bool,
}

/// How the soak's relays reach the consumer: one of the lab's transports
/// ([`ordo_lab::transports::TRANSPORTS`]), by its name, with its summary as
/// the value's help.
#[derive(Debug, Clone, Copy)]
pub struct SoakTransportArg(pub &'static LabTransport);

impl clap::ValueEnum for SoakTransportArg {
    fn value_variants<'a>() -> &'a [Self] {
        static VARIANTS: LazyLock<Vec<SoakTransportArg>> =
            LazyLock::new(|| TRANSPORTS.iter().map(SoakTransportArg).collect());
        &VARIANTS
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.0.name).help(self.0.summary))
    }
}

/// How the bench's relays reach the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// The consumer file, opened by the relay.
    File,
    /// HTTP to an `ordo serve` child process.
    Http,
}

/// How `bench --producers` names its flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlowIdsArg {
    /// The flow's number, zero-padded: flows in flight are neighbours in
    /// every index, as order numbers or time-ordered ids are.
    Sequential,
    /// A hash of the number, as random UUIDs: every event of a batch
    /// writes its own pages.
    Random,
}

/// The most rows a list prints unless told otherwise.
const LIST_LIMIT_DEFAULT: &str = "1000";

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Outbox rows with delivery bookkeeping, oldest first.
    List {
        /// The producer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "P")]
        producer: Location,
        /// Only quarantined rows.
        #[arg(long)]
        quarantined: bool,
        /// Print this destination's bookkeeping of each row.
        #[arg(long, value_name = "NAME", value_parser = crate::destinations::name)]
        destination: Option<ordo_core::DestinationName>,
        /// At most N rows, N >= 1.
        #[arg(long, value_name = "N", default_value = LIST_LIMIT_DEFAULT, value_parser = at_least_one, allow_hyphen_values = true)]
        limit: u64,
    },
    /// Clear an event's quarantine so that the relay tries it once more.
    Retry {
        /// The producer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "P")]
        producer: Location,
        /// The quarantined event.
        #[arg(value_name = "EVENT_ID", value_parser = event_id)]
        event_id: EventId,
        /// The destination whose quarantine to clear (required when the store has several).
        #[arg(long, value_name = "NAME", value_parser = crate::destinations::name)]
        destination: Option<ordo_core::DestinationName>,
    },
    /// The producer's append-only audit log.
    Repairs {
        /// The producer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "P")]
        producer: Location,
    },
    /// Never deliver a flow's unaccepted and later events to one destination, audited.
    Abandon(AbandonArgs),
}

/// `outbox abandon`'s arguments.
#[derive(Debug, Args)]
pub struct AbandonArgs {
    /// The producer store: an SQLite file or a postgres:// URL.
    #[arg(long, value_name = "P")]
    pub producer: Location,
    /// The destination the flow is abandoned for.
    #[arg(long, value_name = "NAME", value_parser = crate::destinations::name)]
    pub destination: ordo_core::DestinationName,
    /// The flow.
    #[arg(long, value_name = "F", value_parser = flow_id)]
    pub flow: FlowId,
    /// Who decided.
    #[arg(long, value_name = "WHO")]
    pub by: String,
    /// Why.
    #[arg(long, value_name = "WHY")]
    pub reason: String,
}

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// Inbox rows, by flow and seq.
    List {
        /// The consumer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "C")]
        consumer: Location,
        /// Only blocked rows.
        #[arg(long)]
        blocked: bool,
        /// Only this flow.
        #[arg(long, value_name = "F", value_parser = flow_id)]
        flow: Option<FlowId>,
        /// Only this producer's rows; with --flow, the producer whose
        /// namespace the flow is in (default: default). Without either,
        /// every producer's.
        #[arg(long, value_name = "NAME")]
        producer_name: Option<ordo_core::ProducerName>,
        /// At most N rows, N >= 1.
        #[arg(long, value_name = "N", default_value = LIST_LIMIT_DEFAULT, value_parser = at_least_one, allow_hyphen_values = true)]
        limit: u64,
    },
    /// Re-evaluate a flow's blocked rows (for example after enabling schema 2) and apply.
    Retry {
        /// The consumer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "C")]
        consumer: Location,
        /// The flow.
        #[arg(long, value_name = "F", value_parser = flow_id)]
        flow: FlowId,
        /// The producer whose namespace the flow is in (default: default).
        #[arg(long, value_name = "NAME", default_value = ordo_core::ProducerName::DEFAULT)]
        producer_name: ordo_core::ProducerName,
        /// Decode schema 2 payloads.
        #[arg(long)]
        support_v2: bool,
    },
    /// Mark the flow's next event skipped (no effect), with who and why in the repair log.
    Skip {
        /// The consumer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "C")]
        consumer: Location,
        /// The flow.
        #[arg(long, value_name = "F", value_parser = flow_id)]
        flow: FlowId,
        /// The producer whose namespace the flow is in (default: default).
        #[arg(long, value_name = "NAME", default_value = ordo_core::ProducerName::DEFAULT)]
        producer_name: ordo_core::ProducerName,
        /// The seq to skip: the flow's next one.
        #[arg(long, value_name = "N", value_parser = seq, allow_hyphen_values = true)]
        seq: Seq,
        /// Why (the business decision).
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Who decided.
        #[arg(long, value_name = "NAME")]
        by: String,
    },
    /// The append-only repair log.
    Repairs {
        /// The consumer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "C")]
        consumer: Location,
    },
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub sides: Sides,
    /// Alert when more than N events are not yet accepted.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64), allow_hyphen_values = true)]
    pub max_backlog: Option<u64>,
    /// Alert when the oldest event not yet accepted is older than this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64), allow_hyphen_values = true)]
    pub max_age: Option<u64>,
    /// Alert when more than N inbox rows are blocked.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64), allow_hyphen_values = true)]
    pub max_blocked: Option<u64>,
    /// Alert when more than N outbox events are quarantined.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64), allow_hyphen_values = true)]
    pub max_quarantined: Option<u64>,
    /// Alert when more than N outbox events are quarantined because their
    /// producer store was rewound (restored from an older backup).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64), allow_hyphen_values = true)]
    pub max_rewound: Option<u64>,
    /// Alert when more than N effect intents are outcome_unknown.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64), allow_hyphen_values = true)]
    pub max_unknown_effects: Option<u64>,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub sides: Sides,
    /// Remove rows delivered or settled longer ago than this (for example 7d, 12h, 30m).
    #[arg(long, value_name = "DURATION", value_parser = duration, allow_hyphen_values = true)]
    pub older_than: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// How many flows (each three events), 1..=10000000.
    #[arg(long, value_name = "N", default_value = "10000",
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub flows: u64,
    /// Events per transaction in every phase (B = K), 1..=100000.
    #[arg(long, value_name = "B", default_value_t = ordo_core::relay::BATCH_LEN_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch: u64,
    /// Run the sequential phases for several batch sizes.
    #[arg(long)]
    pub sweep: bool,
    /// With --sweep, draw throughput against batch size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// The offered rate of the latency run, in events per second.
    #[arg(long, value_name = "EVENTS_PER_S", default_value = "10000",
          value_parser = clap::value_parser!(u64).range(300..=10_000_000))]
    pub rate: u64,
    /// Where to create the temporary files (default: the system's temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Instead of throughput, measure how both files grow with and without pruning.
    #[arg(long)]
    pub growth: bool,
    /// With `http`, instead of the above: the relay over HTTP to an `ordo
    /// serve` on the loopback interface against the relay in process (both
    /// at --batch), per-request latency, and the server under --clients.
    #[arg(long, value_enum, value_name = "T", default_value = "file")]
    pub transport: TransportArg,
    /// With --transport http, clients posting to the server at once, 1..=1024.
    #[arg(long, value_name = "N", default_value = "64",
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub clients: u64,
    /// With --transport http, how long the clients post, in seconds, 1..=600.
    #[arg(long, value_name = "S", default_value = "3",
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub load_seconds: u64,
    /// Instead of throughput, measure N producer threads of one process
    /// sharing one group-committing writer, for each N given (1..=1024,
    /// comma-separated, for example 1,16,64).
    #[arg(long, value_name = "N,...", value_delimiter = ',', conflicts_with = "growth",
          value_parser = clap::value_parser!(u64).range(1..=1_024))]
    pub producers: Vec<u64>,
    /// With --producers, how long each run lasts, in seconds (1..=600).
    #[arg(long, value_name = "S", default_value = "3", requires = "producers",
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub producers_seconds: u64,
    /// With --producers, how flow numbers (one counter shared by every
    /// producer) become flow ids.
    #[arg(
        long,
        value_enum,
        value_name = "IDS",
        default_value = "sequential",
        requires = "producers"
    )]
    pub flow_ids: FlowIdsArg,
    /// Instead of throughput, measure fan-out: one producer file with N
    /// destinations, each relayed to its own consumer file, for each N
    /// given (1..=16, comma-separated, each once; without a list 1,2,4).
    #[arg(long, value_name = "N,...", value_delimiter = ',', num_args = 0..=1,
          default_missing_value = "1,2,4",
          conflicts_with_all = ["growth", "producers", "sweep", "plot", "flows", "rate"],
          value_parser = destination_count)]
    pub destinations: Option<Vec<u64>>,
    /// With --destinations, the flows appended in each run (each three
    /// events), 1..=1000000.
    #[arg(long, value_name = "N", requires = "destinations",
          default_value_t = ordo_lab::bench_destinations::FLOWS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub destinations_flows: u64,
    /// The backend: `sqlite` (files, the default) or `postgres` (the server
    /// of --url: --workers runs, each on a fresh database, F_pg before and
    /// after each).
    #[arg(long, value_enum, value_name = "B", default_value = "sqlite")]
    pub backend: BackendArg,
    /// With --backend postgres, the server (`postgres://USER@HOST:PORT`; its
    /// role needs CREATEDB).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// With --backend postgres, the worker counts, one run each: N relays
    /// and N appliers at once (1..=5, comma-separated; default 1,2,4).
    #[arg(long, value_name = "N,...", value_delimiter = ',',
          value_parser = clap::value_parser!(u64).range(1..=5))]
    pub workers: Vec<u64>,
}

#[derive(Debug, Subcommand)]
pub enum WorkerCommand {
    /// Advance every flow through all three steps, racing other producers.
    Produce {
        #[arg(long)]
        producer: PathBuf,
        /// The flows, comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = flow_id)]
        flows: Vec<FlowId>,
        /// Also the flows `flow-0000001` to `flow-N`.
        #[arg(long)]
        count: Option<u64>,
        #[arg(long, value_parser = quantity)]
        quantity: Quantity,
        /// Spread the flows evenly until this time (ms since the epoch),
        /// flow by flow, so that producing lasts as long as the soak.
        #[arg(long, requires = "spread_from_ms")]
        spread_until_ms: Option<i64>,
        /// The start of the spread (ms since the epoch).
        #[arg(long, requires = "spread_until_ms")]
        spread_from_ms: Option<i64>,
        /// Producer threads sharing one group-committing writer (1..=1024);
        /// without it, one thread calling advance.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_024))]
        threads: Option<u64>,
        /// Append the id of every event acknowledged as committed to this
        /// file, one line each.
        #[arg(long)]
        acks: Option<PathBuf>,
    },
    /// Relay until the marker file exists and nothing is left.
    Relay {
        #[arg(long)]
        producer: PathBuf,
        /// The consumer file.
        #[arg(long, required_unless_present = "to", conflicts_with = "to")]
        consumer: Option<PathBuf>,
        /// Or the HTTP inbox of an `ordo serve`.
        #[arg(long)]
        to: Option<String>,
        /// The destination to relay for (the store's only one if not given).
        #[arg(long, value_parser = crate::destinations::name)]
        destination: Option<ordo_core::DestinationName>,
        /// With --to, sign the requests with this key of --key-file.
        #[arg(long, requires_all = ["to", "key_file"])]
        key_id: Option<String>,
        /// The key file of --key-id.
        #[arg(long, requires = "key_id")]
        key_file: Option<PathBuf>,
        #[arg(long)]
        until: PathBuf,
    },
    /// Apply until the marker file exists and nothing is left.
    Apply {
        #[arg(long)]
        consumer: PathBuf,
        #[arg(long)]
        until: PathBuf,
    },
    /// The wrong control: state and event in two transactions, exit 81 between them.
    UnsafeDualWrite {
        #[arg(long)]
        producer: PathBuf,
        #[arg(long, value_parser = flow_id)]
        flow: FlowId,
        #[arg(long, value_parser = quantity)]
        quantity: Quantity,
    },
}

#[derive(Debug, Args)]
pub struct AdvanceArgs {
    /// The producer store: an SQLite file or a postgres:// URL.
    #[arg(long, value_name = "P")]
    pub producer: Location,
    /// The flow to advance.
    #[arg(long, value_name = "F", value_parser = flow_id)]
    pub flow: FlowId,
    /// The flow's last seq as the caller knows it (0 for a new flow).
    #[arg(long, value_name = "N", value_parser = expected_seq, allow_hyphen_values = true)]
    pub expected_seq: i64,
    /// The target state: reserved, confirmed or released.
    #[arg(long, value_name = "STATE", value_parser = target)]
    pub to: FlowState,
    /// The flow's quantity (required for reserved; later steps default to the flow's).
    #[arg(long, value_name = "Q", value_parser = quantity, allow_hyphen_values = true)]
    pub quantity: Option<Quantity>,
    /// The payload schema to emit: 1 ({"amount": q}) or 2 ({"units": q}).
    #[arg(long, value_name = "1|2", value_parser = schema, default_value = "1")]
    pub schema: SchemaVersion,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PolicyArg {
    /// Head-of-line only within a flow, round-robin across flows.
    Fair,
    /// Always the oldest unaccepted event; a conflict on it ends the run.
    FirstPending,
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    /// The producer store: an SQLite file or a postgres:// URL.
    #[arg(long, value_name = "P")]
    pub producer: Location,
    /// The destination to relay for (required when the store has several).
    #[arg(long, value_name = "NAME", value_parser = crate::destinations::name)]
    pub destination: Option<ordo_core::DestinationName>,
    /// The consumer store (an SQLite file or a postgres:// URL), opened by this process.
    #[arg(
        long,
        value_name = "C",
        required_unless_present = "to",
        conflicts_with = "to"
    )]
    pub consumer: Option<Location>,
    /// The consumer's HTTP inbox (`http://HOST:PORT` or `https://...`), served by `ordo serve`.
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
    /// Sign each request with the secrets of this key id (with --key-file).
    #[arg(long, value_name = "K", requires = "to", requires = "key_file")]
    pub key_id: Option<String>,
    /// The key file (lines `KEY_ID SECRET_HEX [producer=NAME]`, not readable
    /// by group or others); a key bound to a producer signs only for a
    /// producer store of that name.
    #[arg(long, value_name = "F", requires = "key_id")]
    pub key_file: Option<PathBuf>,
    /// Also trust the certificate authority in this PEM file for https://.
    #[arg(long, value_name = "FILE", requires = "to")]
    pub tls_ca: Option<PathBuf>,
    /// How long one request to --to may take, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 30_000, requires = "to",
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub timeout_ms: u64,
    /// Which unaccepted events to pick.
    #[arg(long, value_enum, default_value = "fair")]
    pub policy: PolicyArg,
    /// Hand over at most N events per round (one consumer and one producer transaction), N >= 1.
    #[arg(long, value_name = "N", default_value_t = ordo_core::relay::BATCH_LEN_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch: u64,
    /// With --policy fair, hand over up to N events of each flow per round, its head and the events after it in seq order, 1..=1024.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=1_024))]
    pub flow_events: u64,
    /// Deliver at most N events (conflicts included), N >= 1.
    #[arg(long, value_name = "N", value_parser = at_least_one, allow_hyphen_values = true)]
    pub max: Option<u64>,
    /// Deliver exactly this event, even if already accepted (ignores --policy and --max).
    #[arg(long, value_name = "EVENT_ID", value_parser = event_id)]
    pub event: Option<EventId>,
    /// Keep running, waking as soon as there is work, until SIGTERM or SIGINT.
    #[arg(long, conflicts_with_all = ["max", "event"])]
    pub follow: bool,
    /// With --follow, serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR", requires = "follow")]
    pub metrics_listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// The consumer store: an SQLite file or a postgres:// URL.
    #[arg(long, value_name = "C")]
    pub consumer: Location,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The consumer store: an SQLite file or a postgres:// URL.
    #[arg(long, value_name = "C")]
    pub consumer: Location,
    /// Apply only this flow (default: every flow with work).
    #[arg(long, value_name = "F", value_parser = flow_id)]
    pub flow: Option<FlowId>,
    /// With --flow, the producer whose namespace the flow is in (default:
    /// default).
    #[arg(long, value_name = "NAME", requires = "flow")]
    pub producer_name: Option<ordo_core::ProducerName>,
    /// Apply at most N events per flow, N >= 1.
    #[arg(long, value_name = "N", value_parser = at_least_one, allow_hyphen_values = true)]
    pub limit: Option<u64>,
    /// Decode schema 2 payloads and re-evaluate rows blocked for unsupported_schema.
    #[arg(long)]
    pub support_v2: bool,
    /// Apply at most N events per transaction, across flows, N >= 1.
    #[arg(long, value_name = "N", default_value_t = ordo_core::APPLY_BATCH_LEN_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch: u64,
    /// Keep running, waking as soon as there is work, until SIGTERM or SIGINT.
    #[arg(long, conflicts_with_all = ["flow", "limit"])]
    pub follow: bool,
    /// With --follow, serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR", requires = "follow")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Record for every applied event a `webhook` effect intent posting it
    /// to URL (http or https; `ordo effects run` decides whether it is allowed).
    #[arg(long, value_name = "URL", value_parser = ordo_http::webhook::check_url)]
    pub webhook: Option<String>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Directory for producer.db and consumer.db.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// How many flows to run, 1..=1000000.
    #[arg(long, value_name = "N", default_value = "1000",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub flows: u64,
    /// Replace producer.db and consumer.db if they already exist in DIR.
    #[arg(long)]
    pub force: bool,
}

fn duration(value: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(value)
        .map_err(|e| format!("must be a duration such as 7d, 12h or 30m ({e})"))
}

fn seq(value: &str) -> Result<Seq, String> {
    let range = format!("1..={}", i64::MAX);
    value
        .parse::<i64>()
        .ok()
        .and_then(|n| Seq::new(n).ok())
        .ok_or_else(|| format!("must be an integer in {range}"))
}

fn flow_id(value: &str) -> Result<FlowId, String> {
    FlowId::new(value).map_err(|e| e.rule)
}

fn event_id(value: &str) -> Result<EventId, String> {
    EventId::new(value).map_err(|e| e.rule)
}

fn integer(value: &str, range: &str) -> Result<i64, String> {
    value
        .parse::<i64>()
        .map_err(|_| format!("must be an integer in {range}"))
}

/// A count bound (`--max`, `--limit`): an integer >= 1.
fn at_least_one(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be an integer >= 1".into()),
    }
}

/// A count of `--destinations`: 1..=16; an empty one (`--destinations ""`,
/// `1,,2`) is refused by name.
fn destination_count(value: &str) -> Result<u64, String> {
    let max = ordo_lab::bench_destinations::DESTINATIONS_MAX as u64;
    match value.parse::<u64>() {
        _ if value.is_empty() => Err("an empty count: give counts such as 1,2,4".into()),
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("each count must be an integer in 1..={max}")),
    }
}

fn expected_seq(value: &str) -> Result<i64, String> {
    let range = format!("0..={}", i64::MAX);
    let n = integer(value, &range)?;
    if n < 0 {
        return Err(format!("must be an integer in {range}"));
    }
    Ok(n)
}

fn quantity(value: &str) -> Result<Quantity, String> {
    let range = format!("1..={}", ordo_reservation::QUANTITY_MAX);
    Quantity::new(integer(value, &range)?).map_err(|e| e.rule)
}

fn schema(value: &str) -> Result<SchemaVersion, String> {
    match value {
        "1" => Ok(SchemaVersion::V1),
        "2" => Ok(SchemaVersion::V2),
        _ => Err("must be 1 or 2".into()),
    }
}

fn target(value: &str) -> Result<FlowState, String> {
    match FlowState::parse(value) {
        Some(state) if state != FlowState::New => Ok(state),
        _ => Err("must be one of reserved, confirmed, released".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ordo soak --transport NAME`'s transport, or clap's error.
    fn soak_transport(name: &str) -> Result<&'static LabTransport, clap::Error> {
        match Cli::try_parse_from(["ordo", "soak", "--transport", name])?.command {
            Command::Soak(args) => Ok(args.transport.expect("given").0),
            other => panic!("not the soak: {other:?}"),
        }
    }

    #[test]
    fn the_soak_takes_every_lab_transport_by_its_name_and_no_other() {
        for transport in &TRANSPORTS {
            let parsed = soak_transport(transport.name).expect(transport.name);
            assert!(std::ptr::eq(parsed, transport), "{}", transport.name);
        }
        let refused = soak_transport("carrier-pigeon").unwrap_err();
        assert_eq!(refused.kind(), clap::error::ErrorKind::InvalidValue);
        let Command::Soak(args) = Cli::try_parse_from(["ordo", "soak"]).unwrap().command else {
            panic!("not the soak");
        };
        assert!(args.transport.is_none(), "file unless given or implied");
    }
}
