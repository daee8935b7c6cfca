//! Test databases on the server named by `ORDO_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432`, without a database name; a role
//! that may create databases is needed): each test directory maps to its
//! own database, cloned from a template migrated once per test process and
//! dropped when the test's thread ends; databases of test processes that
//! are gone are dropped at the next start.

#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use ordo_core::{Clock, SystemClock};
use ordo_postgres::postgres::{Client, NoTls};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer, Schema};
use ordo_reservation::{consumer_schema, producer_schema};

pub mod own_server;
pub mod workers;

const SERVER_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432";
/// The most test databases in use at once in this process, whatever the
/// number of test threads: each holds two to four connections, and the
/// server's connections are shared with everything else.
const DATABASES_AT_ONCE: usize = 8;
/// The schema of the generic suite's test-domain consumer, beside the
/// reservation stores in the same database.
pub const TEST_DOMAIN_SCHEMA: &str = "ordo_testkit";

pub fn server() -> String {
    std::env::var("ORDO_TEST_PG")
        .unwrap_or_else(|_| SERVER_DEFAULT.into())
        .trim_end_matches('/')
        .to_string()
}

pub fn url(database: &str) -> String {
    format!("{}/{database}", server())
}

/// A fresh database of the test's own, kept while the directory lives, and
/// its URL.
pub fn fresh_database() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let target = url(&database_for(dir.path()));
    (dir, target)
}

/// Runs the tests of a binary that take it one at a time (those that open
/// many connections, or cut them).
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`fresh_database`] for a test that runs alone ([`serial`]): the guard,
/// the directory and the URL.
pub fn fresh_database_alone() -> (MutexGuard<'static, ()>, tempfile::TempDir, String) {
    let serial = serial();
    let (dir, target) = fresh_database();
    (serial, dir, target)
}

/// A plain client of the test's own on `target` (no TLS), for checks.
pub fn admin_client(target: &str) -> Client {
    Client::connect(target, NoTls).expect("connect")
}

/// The row of `pg_stat_ssl` of the session named `application_name`, as
/// `admin` sees it (`None`: there is no such session).
pub fn session_ssl(
    admin: &mut Client,
    application_name: &str,
) -> Option<ordo_postgres::postgres::Row> {
    admin
        .query_opt(
            "SELECT s.* FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.application_name = $1",
            &[&application_name],
        )
        .expect("read pg_stat_ssl")
}

pub fn unreachable_server(error: ordo_postgres::postgres::Error) -> ! {
    let error = match std::error::Error::source(&error) {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    };
    panic!(
        "cannot reach PostgreSQL at {} ({error}); start one (`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`) or set ORDO_TEST_PG=postgres://USER@HOST:PORT",
        server()
    )
}

pub fn test_schema() -> Schema {
    Schema::new("testkit")
        .expect("a domain name")
        .migration("CREATE TABLE handled (flow_id text COLLATE \"C\" NOT NULL, seq bigint NOT NULL, PRIMARY KEY (flow_id, seq))")
}

pub fn test_options() -> PgOptions {
    PgOptions {
        schema: Some(TEST_DOMAIN_SCHEMA.into()),
        ..PgOptions::default()
    }
}

fn hash_of(parts: &[&str]) -> u64 {
    let mut hasher = DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// The template's name: changes with anything it holds.
fn template_name() -> String {
    let schemas = [producer_schema(), consumer_schema(), test_schema()];
    let tables = ordo_postgres::tables_ddl();
    let mut parts: Vec<&str> = tables.iter().map(String::as_str).collect();
    parts.extend(schemas.iter().flat_map(|s| {
        s.migrations(ordo_core::domain::Dialect::Postgres)
            .collect::<Vec<_>>()
    }));
    let version = ordo_postgres::SCHEMA_VERSION;
    format!("ordo_tpl_{version}_{:016x}", hash_of(&parts))
}

/// The connection that creates and drops databases, and the template.
struct Admin {
    client: Mutex<Client>,
    template: String,
}

fn admin() -> &'static Admin {
    static ADMIN: OnceLock<Admin> = OnceLock::new();
    ADMIN.get_or_init(|| {
        let mut client =
            Client::connect(&url("postgres"), NoTls).unwrap_or_else(|e| unreachable_server(e));
        let template = template_name();
        // One process at a time builds the template and clears leftovers.
        let lock = "SELECT pg_advisory_lock(1869767791, 1)";
        client.batch_execute(lock).expect("lock");
        drop_leftovers(&mut client);
        build_template(&mut client, &template);
        client
            .batch_execute("SELECT pg_advisory_unlock(1869767791, 1)")
            .expect("unlock");
        Admin {
            client: Mutex::new(client),
            template,
        }
    })
}

/// Drops the test databases of test processes that are gone.
fn drop_leftovers(client: &mut Client) {
    let rows = client
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'ordo\\_t\\_%'",
            &[],
        )
        .expect("list test databases");
    for row in rows {
        let name: String = row.get(0);
        let pid = name.split('_').nth(2).unwrap_or("");
        if !Path::new("/proc").join(pid).exists() {
            let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

fn build_template(client: &mut Client, template: &str) {
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&template])
        .expect("look for the template")
        .is_some();
    if exists {
        return;
    }
    let building = format!("{template}_building");
    client
        .batch_execute(&format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"))
        .expect("drop a template left half built");
    client
        .batch_execute(&format!("CREATE DATABASE {building}"))
        .expect("create the template");
    {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let target = url(&building);
        let options = PgOptions::default();
        PgProducer::open_with(&target, &producer_schema(), clock.clone(), &options)
            .expect("migrate the template's producer");
        PgConsumer::open_with(&target, &consumer_schema(), clock.clone(), &options)
            .expect("migrate the template's consumer");
        PgConsumer::open_with(&target, &test_schema(), clock, &test_options())
            .expect("migrate the template's test domain");
    }
    client
        .batch_execute(&format!("ALTER DATABASE {building} RENAME TO {template}"))
        .expect("name the template");
}

/// Databases at once, across threads.
struct Slots {
    used: Mutex<usize>,
    freed: Condvar,
}

fn slots() -> &'static Slots {
    static SLOTS: Slots = Slots {
        used: Mutex::new(0),
        freed: Condvar::new(),
    };
    &SLOTS
}

/// The databases of the current test's thread, dropped (and its slot
/// freed) when the thread ends.
struct ThreadDatabases {
    names: Vec<String>,
}

impl ThreadDatabases {
    fn new() -> ThreadDatabases {
        let slots = slots();
        let mut used = slots.used.lock().expect("slots");
        while *used >= DATABASES_AT_ONCE {
            used = slots.freed.wait(used).expect("slots");
        }
        *used += 1;
        ThreadDatabases { names: Vec::new() }
    }
}

impl Drop for ThreadDatabases {
    fn drop(&mut self) {
        // On a thread of its own: the client cannot run in a thread-local
        // destructor, where the runtime's thread-locals are gone.
        let names = std::mem::take(&mut self.names);
        let dropper = std::thread::spawn(move || {
            if let Ok(mut client) = admin().client.lock() {
                for name in &names {
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
                }
            }
        });
        let _ = dropper.join();
        let slots = slots();
        *slots.used.lock().expect("slots") -= 1;
        slots.freed.notify_one();
    }
}

thread_local! {
    static DATABASES: std::cell::RefCell<Option<ThreadDatabases>> = const { std::cell::RefCell::new(None) };
}

/// The database of a test's directory, cloned from the template the first
/// time.
pub fn database_for(dir: &Path) -> String {
    let admin = admin();
    let name = format!(
        "ordo_t_{}_{:016x}",
        std::process::id(),
        hash_of(&[&dir.display().to_string()])
    );
    DATABASES.with(|cell| {
        let mut cell = cell.borrow_mut();
        let databases = cell.get_or_insert_with(ThreadDatabases::new);
        if databases.names.contains(&name) {
            return;
        }
        let mut client = admin.client.lock().expect("admin connection");
        client
            .batch_execute(&format!(
                "CREATE DATABASE {name} TEMPLATE {}",
                admin.template
            ))
            .unwrap_or_else(|e| panic!("cannot create the test database {name}: {e}"));
        databases.names.push(name.clone());
    });
    name
}

/// Brings the consumer tables in `schema` back from version 11 to 8: no
/// effect intents (11), and one namespace, as the third release's first
/// stores kept them (9).
pub fn undo_producer_namespaces(schema: &str) -> String {
    format!(
        "DROP TABLE {schema}.effect_intent;
         DROP TABLE {schema}.effect_order;
         ALTER TABLE {schema}.repair_log DROP COLUMN key;
         ALTER TABLE {schema}.inbox DROP COLUMN producer;
         ALTER TABLE {schema}.inbox ADD PRIMARY KEY (event_id);
         ALTER TABLE {schema}.inbox ADD CONSTRAINT inbox_flow_id_seq_key UNIQUE (flow_id, seq);
         CREATE INDEX inbox_pending ON {schema}.inbox (flow_id) WHERE status = 'pending';
         CREATE INDEX inbox_blocked ON {schema}.inbox (flow_id) WHERE status = 'blocked';
         ALTER TABLE {schema}.inbox_cursor DROP COLUMN producer;
         ALTER TABLE {schema}.inbox_cursor ADD PRIMARY KEY (flow_id);
         ALTER TABLE {schema}.inbox_fingerprint DROP COLUMN producer;
         ALTER TABLE {schema}.inbox_fingerprint ADD PRIMARY KEY (flow_id, seq);
         ALTER TABLE {schema}.inbox_fingerprint
             ADD CONSTRAINT inbox_fingerprint_event_id_key UNIQUE (event_id);
         ALTER TABLE {schema}.inbox_watermark DROP COLUMN producer;
         ALTER TABLE {schema}.inbox_watermark DROP COLUMN store_id;
         ALTER TABLE {schema}.inbox_watermark ADD PRIMARY KEY (flow_id);
         ALTER TABLE {schema}.repair_log DROP COLUMN producer;
         ALTER TABLE {schema}.repair_log DROP COLUMN store_id;"
    )
}

/// The statements that take the producer schema `schema`'s tables back
/// from version 10 to version 9, keeping their state: the one
/// destination's marks, heads and leases back into the outbox and its
/// heads (the caller sets the version it means).
pub fn undo_custody(schema: &str) -> String {
    format!(
        "ALTER TABLE {schema}.outbox ADD COLUMN quarantined boolean NOT NULL DEFAULT false,
             ADD COLUMN quarantine_reason text, ADD COLUMN attempts bigint NOT NULL DEFAULT 0,
             ADD COLUMN last_outcome text, ADD COLUMN last_error text,
             ADD COLUMN next_attempt_at_ms bigint NOT NULL DEFAULT 0;
         UPDATE {schema}.outbox o SET quarantined = c.quarantined,
             quarantine_reason = c.quarantine_detail, attempts = c.attempts,
             last_outcome = c.last_outcome, last_error = c.last_error,
             next_attempt_at_ms = c.next_attempt_at_ms
         FROM {schema}.custody c WHERE c.position = o.position AND c.destination = 1;
         ALTER TABLE {schema}.outbox DROP COLUMN destinations_waiting;
         CREATE TABLE {schema}.outbox_pending (position bigint PRIMARY KEY);
         INSERT INTO {schema}.outbox_pending (position)
             SELECT position FROM {schema}.custody_pending WHERE destination = 1;
         ALTER TABLE {schema}.outbox_head ADD COLUMN relay_seq bigint,
             ADD COLUMN relay_due_ms bigint NOT NULL DEFAULT 0,
             ADD COLUMN relay_turn bigint NOT NULL DEFAULT 0,
             ADD COLUMN lease_owner text, ADD COLUMN lease_fence bigint NOT NULL DEFAULT 0,
             ADD COLUMN lease_expires_at_ms bigint NOT NULL DEFAULT 0,
             ADD COLUMN lease_backend_pid integer, ADD COLUMN relay_stop_seq bigint;
         UPDATE {schema}.outbox_head h SET relay_seq = r.relay_seq, relay_due_ms = r.relay_due_ms,
             relay_turn = r.relay_turn, lease_owner = r.lease_owner, lease_fence = r.lease_fence,
             lease_expires_at_ms = r.lease_expires_at_ms, lease_backend_pid = r.lease_backend_pid,
             relay_stop_seq = r.relay_stop_seq
         FROM {schema}.relay_head r WHERE r.flow_id = h.flow_id AND r.destination = 1;
         CREATE INDEX outbox_head_relay ON {schema}.outbox_head (relay_turn, flow_id)
             WHERE relay_seq IS NOT NULL;
         DROP TABLE {schema}.relay_head, {schema}.custody, {schema}.custody_pending;"
    )
}
