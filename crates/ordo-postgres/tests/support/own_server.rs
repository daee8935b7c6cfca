//! A PostgreSQL server of the test's own, for settings the shared server
//! must keep (client certificates required, say): a new cluster in a
//! temporary directory, on a free port of `localhost`, stopped and removed when
//! dropped. The binaries are found at `ORDO_TEST_PG_BIN`, else by
//! `pg_config --bindir`, else in `/usr/lib/postgresql/*/bin`. As root, the
//! server runs as the `postgres` user (it refuses root). A test process
//! killed outright leaves its server running (`pg_ctl` detaches it) until
//! it is stopped by hand (`pg_ctl -D /tmp/.tmpXXXX/data stop`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// How many ports a start tries.
const START_ATTEMPTS: u32 = 3;

/// A running server of the test's own.
pub struct OwnServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The user the server runs as, when not the test's.
    run_as: Option<String>,
    pub port: u16,
}

/// What a server is started with: its `postgresql.conf` settings, its
/// `pg_hba.conf`, and files to put in its directory (name, contents) that
/// only its user may read.
pub struct Setup<'a> {
    pub settings: &'a [(&'a str, &'a str)],
    pub hba: &'a str,
    pub files: &'a [(&'a str, &'a str)],
}

impl OwnServer {
    pub fn start(setup: &Setup<'_>) -> OwnServer {
        let bin = binaries();
        let run_as = is_root().then(|| "postgres".to_owned());
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server = OwnServer {
            dir,
            bin,
            run_as,
            port: 0,
        };
        server.give(server.dir.path());
        server.run(
            "initdb",
            &[
                "-D",
                &server.data(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        for (name, contents) in setup.files {
            let path = server.dir.path().join(name);
            std::fs::write(&path, contents).expect("write a server file");
            set_mode(&path, 0o600);
            server.give(&path);
        }
        let hba = Path::new(&server.data()).join("pg_hba.conf");
        std::fs::write(&hba, setup.hba).expect("write pg_hba.conf");
        server.give(&hba);
        let settings: String = setup
            .settings
            .iter()
            .map(|(key, value)| {
                let value = value.replace("$DIR", &server.dir.path().display().to_string());
                format!(" -c {key}={value}")
            })
            .collect();
        // The free port found may be taken before the server binds it:
        // another is tried.
        for attempt in 1..=START_ATTEMPTS {
            server.port = free_port();
            let options = format!(
                "-c port={} -c listen_addresses=localhost -c unix_socket_directories={} \
                 -c fsync=off{settings}",
                server.port,
                server.dir.path().display()
            );
            let log = server.dir.path().join("server.log");
            let log = log.to_str().expect("a UTF-8 path");
            let args = [
                "-D",
                &server.data(),
                "-l",
                log,
                "-o",
                &options,
                "-w",
                "start",
            ];
            if attempt == START_ATTEMPTS {
                server.run("pg_ctl", &args);
            } else if server.try_run("pg_ctl", &args) {
                break;
            }
        }
        server
    }

    /// The directory of the server's files (`$DIR` in settings).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// The server binary `name`, to run as the server's user.
    fn command(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&program);
                command
            }
            None => Command::new(&program),
        };
        // A directory the server's user may enter.
        command.current_dir(self.dir.path());
        command
    }

    /// Runs the server binary `name`; whether it succeeded.
    fn try_run(&self, name: &str, args: &[&str]) -> bool {
        let out = self.command(name).args(args).output();
        out.is_ok_and(|out| out.status.success())
    }

    /// Runs the server binary `name`; panics with its output when it
    /// fails.
    fn run(&self, name: &str, args: &[&str]) {
        let out = self
            .command(name)
            .args(args)
            .output()
            .expect("run a server binary");
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "{name} {args:?}: {}\n{}\n{log}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Makes `path` the server user's.
    fn give(&self, path: &Path) {
        if let Some(user) = &self.run_as {
            let out = Command::new("chown")
                .arg(user)
                .arg(path)
                .output()
                .expect("run chown");
            assert!(out.status.success(), "chown {user} {}", path.display());
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn binaries() -> PathBuf {
    if let Some(bin) = std::env::var_os("ORDO_TEST_PG_BIN") {
        return PathBuf::from(bin);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && bin.join("initdb").is_file() {
            return bin;
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    // The newest version: the directories are named by major version.
    let version = |bin: &PathBuf| -> u32 {
        let name = bin.parent().and_then(|dir| dir.file_name());
        name.and_then(|n| n.to_str())
            .and_then(|n| n.split('.').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    found.sort_by_key(version);
    found.pop().unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server binaries (initdb, pg_ctl) found: install PostgreSQL's \
             server package or set ORDO_TEST_PG_BIN to their directory"
        )
    })
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().expect("run id -u");
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}
