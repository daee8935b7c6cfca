//! Long-running `ordo` processes as the tests (and the console benchmark,
//! which includes this file and has no `CARGO_BIN_EXE_ordo`) hold them.

use std::io::{BufRead, BufReader, Read};
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command, Stdio};

/// A child process, killed (and reaped) when dropped.
pub struct Process(pub Child);

impl Deref for Process {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The address in the first line of `stdout`, `listening on ADDR`; the
/// line itself when it says something else.
pub fn listening_addr(stdout: impl Read) -> Result<String, String> {
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("stdout is readable");
    match line.trim().strip_prefix("listening on ") {
        Some(addr) => Ok(addr.to_owned()),
        None => Err(line),
    }
}

/// Starts `command` with its stdout piped here and reads the address from
/// its first line (see [`listening_addr`]); `what` names it in a panic.
pub fn start_listening(command: &mut Command, what: &str) -> (Process, String) {
    let child = command
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    let mut process = Process(child);
    let addr = listening_addr(process.stdout.as_mut().expect("stdout is piped"))
        .unwrap_or_else(|line| panic!("{what} said {line:?}"));
    (process, addr)
}
