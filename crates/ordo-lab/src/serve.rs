//! `ordo serve` as a child process of the lab: started on an address, its
//! bound address read from its first stdout line (`listening on ADDR`), the
//! rest of its stdout drained so that it never blocks on a full pipe.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ordo_core::crash::CRASH_POINT_ENV;

/// How long a starting server may take to name its address.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// The level of a served child's logs (on stderr).
const LOG_LEVEL: &str = "warn";

/// A running `ordo serve` and the address it bound.
pub struct Served {
    /// The process.
    pub child: Child,
    /// The address it listens on.
    pub addr: SocketAddr,
}

impl Served {
    /// The base URL a relay's `--to` takes.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server (SIGKILL: it holds nothing a commit needs) and
    /// waits for it.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How to start one server.
pub struct ServeSpec<'a> {
    /// The `ordo` binary.
    pub exe: &'a Path,
    /// The consumer store, which must exist.
    pub consumer: &'a Path,
    /// The address to bind (port 0: any free port).
    pub listen: SocketAddr,
    /// A crash point to arm in the server.
    pub crash_point: Option<&'a str>,
    /// A file its logs are appended to (discarded if `None`).
    pub log: Option<&'a Path>,
    /// More flags of `ordo serve`.
    pub flags: &'a [String],
}

/// Any free port on the loopback interface.
pub fn loopback_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Starts `ordo serve` and waits for its listening line; a server that
/// exits first (its port taken, its store missing) or says nothing in time
/// is an error, with its exit status.
pub fn start(spec: &ServeSpec<'_>) -> Result<Served, String> {
    let stderr = match spec.log {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(Stdio::from)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?,
        None => Stdio::null(),
    };
    let mut command = Command::new(spec.exe);
    command
        .args(["serve", "--consumer"])
        .arg(spec.consumer)
        .arg("--listen")
        .arg(spec.listen.to_string())
        .args(spec.flags)
        .env_remove(CRASH_POINT_ENV)
        .env_remove(crate::faults::FAULT_ENV)
        .env("RUST_LOG", LOG_LEVEL)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    if let Some(point) = spec.crash_point {
        command.env(CRASH_POINT_ENV, point);
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", spec.exe.display()))?;
    let first_line = first_line(&mut child);
    match first_line.as_deref().and_then(listening_addr) {
        Some(addr) => Ok(Served { child, addr }),
        None => {
            let _ = child.kill();
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            Err(format!(
                "`ordo serve --listen {}` did not start ({status}); its first line: {first_line:?}",
                spec.listen
            ))
        }
    }
}

/// The first stdout line of `child`, within [`START_TIMEOUT`]; the rest is
/// read and dropped on the reading thread until the child closes it.
fn first_line(child: &mut Child) -> Option<String> {
    let stdout = child.stdout.take()?;
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = sender.send(line);
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    receiver.recv_timeout(START_TIMEOUT).ok()
}

/// The address of a `listening on ADDR` line.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    line.trim().strip_prefix("listening on ")?.parse().ok()
}

/// The peak resident memory of process `pid` (`VmHWM`), in bytes.
pub fn peak_memory_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_line_names_the_address() {
        assert_eq!(
            listening_addr("listening on 127.0.0.1:4100\n"),
            Some(SocketAddr::from(([127, 0, 0, 1], 4100)))
        );
        assert_eq!(listening_addr(""), None);
        assert_eq!(listening_addr("{\"listening\":\"127.0.0.1:1\"}"), None);
    }

    #[test]
    fn this_process_has_a_peak_memory() {
        assert!(peak_memory_bytes(std::process::id()).unwrap() > 0);
        assert_eq!(peak_memory_bytes(u32::MAX), None);
    }
}
