//! What the console's tests share, over HTTP and in a browser: stores with
//! every kind of trouble built by the real CLI, and a running `ordo
//! console` over them at a fixed clock.

use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{envelope, reservation, Lab};

/// The clock the stores are built at.
pub const T0: i64 = 1_700_000_000_000;
/// The clock of the status and of the console: well after every event.
pub const NOW: i64 = T0 + 90_500;

/// Both stores with every kind of trouble: a quarantined event (A-1, the
/// consumer holding another body), applied flows, a pending backlog (C-1),
/// a flow waiting on a gap (G), and a blocked row (X-1, an unknown schema)
/// whose type and payload hold markup.
pub fn troubled() -> Lab {
    troubled_in(Lab::new())
}

/// [`troubled`] in the (empty) stores of `lab`.
pub fn troubled_in(lab: Lab) -> Lab {
    lab.at(T0).init();
    lab.at(T0).advance("A", 0, "reserved", Some(5));
    lab.at(T0 + 100).advance("B", 0, "reserved", Some(2));
    lab.at(T0 + 200).advance("A", 1, "confirmed", None);
    lab.at(T0 + 300)
        .receive(&reservation("A", 1, "reserved", 9));
    lab.at(T0 + 400).relay(&[]);
    lab.at(T0 + 450).relay(&[]);
    lab.at(T0 + 500).advance("C", 0, "reserved", Some(1));
    let x = envelope(
        "X-1",
        "X",
        1,
        9,
        "<script>alert('type')</script>",
        json!({"note": "<script>alert('payload')</script>"}),
    );
    lab.at(T0 + 600).receive(&x);
    lab.at(T0 + 700)
        .receive(&reservation("G", 2, "confirmed", 1));
    lab.at(T0 + 800).apply(&[]);
    lab
}

/// The overview's numbers, by `data-metric` name, as `ordo status --json`
/// (both sides) gives them.
pub fn status_metrics(status: &Value) -> [(&'static str, &Value); 7] {
    [
        ("backlog", &status["producer"]["backlog"]),
        (
            "oldest_pending_age_s",
            &status["producer"]["oldest_pending_age_s"],
        ),
        ("quarantined", &status["producer"]["quarantined"]),
        ("blocked", &status["consumer"]["blocked"]["total"]),
        ("gaps_total", &status["consumer"]["gaps_total"]),
        ("applied", &status["consumer"]["applied"]),
        ("skipped", &status["consumer"]["skipped"]),
    ]
}

/// A token file in the lab's directory holding `s3cret-token`, with
/// permission bits `mode`.
pub fn token_file(lab: &Lab, mode: u32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = lab.path("token");
    std::fs::write(&path, "s3cret-token\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// The consumer's repair log, as `ordo inbox repairs --json` gives it.
pub fn repairs(lab: &Lab) -> Value {
    lab.at(NOW)
        .run(&["inbox", "repairs", "--json", "--consumer", &lab.c])
        .json()
}

/// A running `ordo console`; killed when dropped.
pub struct Console {
    child: Child,
    /// The address it listens on.
    pub addr: String,
    stderr: Arc<Mutex<String>>,
}

impl Console {
    /// Starts `ordo console ARGS --listen 127.0.0.1:0` at `ORDO_NOW_MS=NOW`
    /// and reads the address from its first stdout line.
    pub fn start(args: &[&str]) -> Console {
        Console::start_at(NOW, args)
    }

    /// [`Console::start`] with its clock at `now_ms`.
    pub fn start_at(now_ms: i64, args: &[&str]) -> Console {
        let (child, addr, stderr) = super::spawn_listening(
            Command::new(env!("CARGO_BIN_EXE_ordo"))
                .arg("console")
                .args(args)
                .args(["--listen", "127.0.0.1:0"])
                .env("ORDO_NOW_MS", now_ms.to_string()),
        );
        Console {
            child,
            addr,
            stderr,
        }
    }

    /// The URL of `path` on this console.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> i32 {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on the pid of our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait works") {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "console did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("console stderr:\n{}", self.stderr.lock().unwrap());
        }
    }
}
