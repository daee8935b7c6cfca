//! Fresh, empty PostgreSQL databases for the process-level tests, on the
//! server named by `ORDO_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432`, without a database name; the role
//! must be allowed to create databases). Each [`Database`] is dropped with
//! its value; databases left by test processes that are gone are dropped at
//! the next start.

#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use ordo_postgres::postgres::{Client, NoTls};

const SERVER_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432";
/// The prefix of this suite's database names, then the process id.
const PREFIX: &str = "ordo_cli_";

/// The server, without a database name.
pub fn server() -> String {
    std::env::var("ORDO_TEST_PG")
        .unwrap_or_else(|_| SERVER_DEFAULT.into())
        .trim_end_matches('/')
        .to_string()
}

/// A connection of the test's own to the server's `postgres` database.
pub fn admin_client() -> Client {
    Client::connect(&format!("{}/postgres", server()), NoTls)
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {} ({e})", server()))
}

/// The databases on the server whose names start with `prefix` (a prefix
/// of letters, digits and `_`), sorted.
pub fn databases_named(client: &mut Client, prefix: &str) -> Vec<String> {
    client
        .query(
            "SELECT datname::text FROM pg_database WHERE datname LIKE $1 ORDER BY 1",
            &[&format!("{}%", prefix.replace('_', "\\_"))],
        )
        .expect("list databases")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The connection that creates and drops databases; leftovers are dropped
/// when it is first made.
fn admin() -> &'static Mutex<Client> {
    static ADMIN: OnceLock<Mutex<Client>> = OnceLock::new();
    ADMIN.get_or_init(|| {
        let url = format!("{}/postgres", server());
        let mut client = Client::connect(&url, NoTls).unwrap_or_else(|e| {
            panic!(
                "cannot reach PostgreSQL at {} ({e}); start one or set ORDO_TEST_PG=postgres://USER@HOST:PORT",
                server()
            )
        });
        for name in databases_named(&mut client, PREFIX) {
            let pid = name[PREFIX.len()..].split('_').next().unwrap_or("");
            if !Path::new("/proc").join(pid).exists() {
                let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
        Mutex::new(client)
    })
}

/// An empty database of its own for one test; dropped with the value.
pub struct Database {
    pub name: String,
}

impl Database {
    pub fn create() -> Database {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{PREFIX}{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        admin()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("cannot create the test database {name}: {e}"));
        Database { name }
    }

    /// `postgres://USER@HOST:PORT/NAME`, as the server is given.
    pub fn url(&self) -> String {
        format!("{}/{}", server(), self.name)
    }

    /// [`Database::url`] with a password in it: the server's own if it has
    /// one, else `password` (which a server trusting the role ignores).
    pub fn url_with_password(&self, password: &str) -> (String, String) {
        let server = server();
        let (scheme, rest) = server.split_once("://").expect("a URL");
        let (user_info, host) = rest.split_once('@').expect("ORDO_TEST_PG names a user");
        let (user, password) = match user_info.split_once(':') {
            Some((user, own)) => (user, own.to_owned()),
            None => (user_info, password.to_owned()),
        };
        (
            format!("{scheme}://{user}:{password}@{host}/{}", self.name),
            password,
        )
    }

    /// A connection of the test's own to the database.
    pub fn client(&self) -> Client {
        Client::connect(&self.url(), NoTls).expect("connect to the test database")
    }

    /// The schemas ordo created in the database, sorted.
    pub fn ordo_schemas(&self) -> Vec<String> {
        self.client()
            .query(
                "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'ordo%' ORDER BY 1",
                &[],
            )
            .expect("list schemas")
            .iter()
            .map(|row| row.get(0))
            .collect()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let mut client = admin().lock().unwrap_or_else(|e| e.into_inner());
        let _ = client.batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

/// Runs the tests that compare the server's databases before and after
/// their runs one at a time (within one test binary).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The server's databases whose names start with a prefix, watched by a
/// test that runs alone ([`serial`]): those there when it began, and now.
pub struct Watched {
    _serial: std::sync::MutexGuard<'static, ()>,
    /// A connection of the test's own to the server's `postgres` database.
    pub client: Client,
    prefix: &'static str,
    /// The databases there when the watch began, sorted.
    pub before: Vec<String>,
    /// Those of them made by another process then running.
    others: Vec<String>,
}

impl Watched {
    pub fn start(prefix: &'static str) -> Watched {
        let serial = serial();
        let mut client = admin_client();
        let before = databases_named(&mut client, prefix);
        let others = (before.iter())
            .filter(|name| made_by_another_live_process(name))
            .cloned()
            .collect();
        Watched {
            _serial: serial,
            client,
            prefix,
            before,
            others,
        }
    }

    /// The databases there now, sorted, as far as this test's processes
    /// made or dropped them: another process's run on the same server
    /// (running when the watch began, or since and still running) is left
    /// out, its databases at the start counted as kept. A database whose
    /// process has exited was left behind.
    pub fn now(&mut self) -> Vec<String> {
        let mut now: Vec<String> = databases_named(&mut self.client, self.prefix)
            .into_iter()
            .filter(|name| !self.others.contains(name) && !made_by_another_live_process(name))
            .chain(self.others.iter().cloned())
            .collect();
        now.sort();
        now
    }
}

/// Whether the database `name` (`PREFIX` `HOST_PID_N`, `_kept` at the end
/// for a kept one) was made by a process other than this one that is still
/// running.
fn made_by_another_live_process(name: &str) -> bool {
    let mut parts = name.trim_end_matches("_kept").rsplit('_');
    let (_number, pid) = (parts.next(), parts.next());
    match pid.and_then(|pid| pid.parse::<u32>().ok()) {
        Some(pid) => {
            pid != std::process::id()
                && std::path::Path::new("/proc").join(pid.to_string()).exists()
        }
        None => false,
    }
}

/// The `--backend` / `--url` misuses that every lab command on PostgreSQL
/// (`experiment`, `soak`, `bench`) refuses with exit 2, before it connects
/// or creates anything, each with a phrase of its message, then the
/// command's own misuses `more`. The password of the last URL must never be
/// printed.
pub fn backend_url_misuses(
    server: &str,
    more: &[(&[&str], &'static str)],
) -> Vec<(Vec<String>, &'static str)> {
    let cases: [(&[&str], &str); 5] = [
        (&["--url", server], "--url needs --backend postgres"),
        (
            &["--backend", "sqlite", "--url", server],
            "--url needs --backend postgres",
        ),
        (&["--backend", "postgres"], "--backend postgres needs --url"),
        (
            &["--backend", "postgres", "--url", "host=127.0.0.1"],
            "not a postgres://",
        ),
        (
            &[
                "--backend",
                "postgres",
                "--url",
                "postgres://u:sekret@127.0.0.1:notaport",
            ],
            "not a PostgreSQL connection URL",
        ),
    ];
    cases
        .iter()
        .chain(more)
        .map(|(flags, needle)| (flags.iter().map(|f| f.to_string()).collect(), *needle))
        .collect()
}
