//! A PostgreSQL server of the test's own, for settings the shared server
//! must keep (client certificates required, say): a new cluster in a
//! temporary directory, on a free port of `localhost`, stopped and removed when
//! dropped. The binaries are found at `ORDO_TEST_PG_BIN`, else by
//! `pg_config --bindir`, else in `/usr/lib/postgresql/*/bin`. As root, the
//! server runs as the `postgres` user (it refuses root).

use std::path::{Path, PathBuf};
use std::process::Command;

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
        let server = OwnServer {
            dir,
            bin,
            run_as,
            port: free_port(),
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
        let mut options = format!(
            "-c port={} -c listen_addresses=localhost -c unix_socket_directories={} -c fsync=off",
            server.port,
            server.dir.path().display()
        );
        for (key, value) in setup.settings {
            let value = value.replace("$DIR", &server.dir.path().display().to_string());
            options.push_str(&format!(" -c {key}={value}"));
        }
        let log = server.dir.path().join("server.log");
        let log = log.to_str().expect("a UTF-8 path");
        server.run(
            "pg_ctl",
            &[
                "-D",
                &server.data(),
                "-l",
                log,
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
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
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&program);
                command
            }
            None => Command::new(&program),
        }
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
    found.sort();
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
