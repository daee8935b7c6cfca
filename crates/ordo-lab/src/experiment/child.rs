//! Real `ordo` child processes, each under a watchdog.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ordo_core::crash::CRASH_POINT_ENV;
use serde_json::Value;

/// How long any child may run before its scenario fails. A hang guard, not a
/// performance measure.
pub const WATCHDOG: Duration = Duration::from_secs(60);
/// The environment variable that fixes the clock of an `ordo` process.
pub const NOW_ENV: &str = "ORDO_NOW_MS";
/// How often a waiting parent looks at its child.
const POLL: Duration = Duration::from_millis(2);

/// `a-1`: flow `a` reserved with quantity 5.
pub const ADVANCE_RESERVED: [&str; 11] = [
    "advance",
    "--producer",
    "{P}",
    "--flow",
    "a",
    "--expected-seq",
    "0",
    "--to",
    "reserved",
    "--quantity",
    "5",
];
/// One relay round from the producer to the consumer.
pub const RELAY: [&str; 5] = ["relay", "--producer", "{P}", "--consumer", "{C}"];
/// One apply run at the consumer.
pub const APPLY: [&str; 3] = ["apply", "--consumer", "{C}"];

/// The stores of one scenario and the binary that runs on them.
pub struct Ctx {
    pub exe: PathBuf,
    /// The scenario's own directory (its SQLite files, marker files, logs).
    pub dir: PathBuf,
    /// What `{P}` and `{C}` stand for: the SQLite files in `dir`, or the
    /// URL of the scenario's own PostgreSQL database (both roles in it).
    pub stores: Stores,
}

/// Where a scenario's two stores live.
pub enum Stores {
    /// `producer.db` and `consumer.db` in the scenario's directory.
    Files,
    /// One PostgreSQL database holding both roles' schemas, by URL.
    Postgres(String),
}

/// What a finished child left: its exit code and its stdout parsed as JSON
/// (`Value::Null` when it printed nothing).
#[derive(Debug, Clone)]
pub struct Run {
    pub code: i32,
    pub json: Value,
    pub stderr: String,
}

impl Run {
    /// Its JSON if it exited 0, else an error naming the command line
    /// `shown`, the exit code and what it wrote to stderr.
    pub fn json_if_ok(self, shown: &str) -> Result<Value, String> {
        if self.code != 0 {
            return Err(format!(
                "`ordo {shown}` exited {}: {}",
                self.code,
                self.stderr.trim()
            ));
        }
        Ok(self.json)
    }
}

fn code_of(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Waits for a child, killing it when `watchdog` expires.
pub fn wait(child: &mut Child, what: &str, watchdog: Duration) -> Result<ExitStatus, String> {
    let deadline = Instant::now() + watchdog;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "watchdog: `{what}` did not finish within {} s",
                    watchdog.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => return Err(format!("cannot wait for `{what}`: {e}")),
        }
    }
}

/// Collects a finished child's output, killing it past [`WATCHDOG`].
pub fn finish(child: Child, what: &str) -> Result<Run, String> {
    finish_within(child, what, WATCHDOG)
}

/// Collects a finished child's output, killing it past `watchdog`.
pub fn finish_within(mut child: Child, what: &str, watchdog: Duration) -> Result<Run, String> {
    // Read both pipes while waiting, so that a child printing more than a
    // pipe holds is never blocked on its output.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait(&mut child, what, watchdog)?;
    let (stdout, stderr) = (stdout.join(), stderr.join());
    let stdout = String::from_utf8_lossy(&stdout);
    let json = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(stdout.trim())
            .map_err(|e| format!("`{what}` printed non-JSON ({e}): {stdout}"))?
    };
    Ok(Run {
        code: code_of(status),
        json,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// Reads a pipe to its end on a thread of its own.
struct Drain(Option<std::thread::JoinHandle<Vec<u8>>>);

impl Drain {
    /// Everything the pipe delivered (empty when there was no pipe).
    fn join(self) -> Vec<u8> {
        self.0
            .and_then(|handle| handle.join().ok())
            .unwrap_or_default()
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> Drain {
    Drain(pipe.map(|mut pipe| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            // A read error ends the output early; the exit status still tells.
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    }))
}

impl Ctx {
    /// The producer store, as `--producer` takes it.
    pub fn producer(&self) -> PathBuf {
        match &self.stores {
            Stores::Files => self.dir.join("producer.db"),
            Stores::Postgres(url) => PathBuf::from(url),
        }
    }

    /// The consumer store, as `--consumer` takes it.
    pub fn consumer(&self) -> PathBuf {
        match &self.stores {
            Stores::Files => self.dir.join("consumer.db"),
            Stores::Postgres(url) => PathBuf::from(url),
        }
    }

    /// Starts `ordo --json ARGS` with `{P}` and `{C}` in ARGS replaced by
    /// the scenario's files, stdin piped, and `crash` armed if given.
    pub fn spawn(&self, args: &[&str], crash: Option<&str>) -> Result<Child, String> {
        self.spawn_env(args, crash, &[])
    }

    /// [`Ctx::spawn`] with extra environment variables.
    pub fn spawn_env(
        &self,
        args: &[&str],
        crash: Option<&str>,
        env: &[(&str, String)],
    ) -> Result<Child, String> {
        let args = self.expand(args);
        let mut command = Command::new(&self.exe);
        command
            .arg("--json")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove(CRASH_POINT_ENV);
        if let Some(point) = crash {
            command.env(CRASH_POINT_ENV, point);
        }
        command.env_remove(NOW_ENV);
        for (key, value) in env {
            command.env(key, value);
        }
        command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.exe.display()))
    }

    fn expand(&self, args: &[&str]) -> Vec<String> {
        let p = self.producer().display().to_string();
        let c = self.consumer().display().to_string();
        replace_stores(args, &p, &c)
    }

    /// The command line as reports show it: a URL without its password.
    pub fn shown(&self, args: &[&str]) -> String {
        let shown = match &self.stores {
            Stores::Files => return self.expand(args).join(" "),
            Stores::Postgres(url) => super::pg::redact(url),
        };
        replace_stores(args, &shown, &shown).join(" ")
    }
}

fn replace_stores(args: &[&str], p: &str, c: &str) -> Vec<String> {
    args.iter()
        .map(|a| a.replace("{P}", p).replace("{C}", c))
        .collect()
}

impl Ctx {
    /// Runs `ordo --json ARGS` to completion with `stdin` as input.
    pub fn run(&self, args: &[&str], stdin: &[u8], crash: Option<&str>) -> Result<Run, String> {
        let what = self.shown(args);
        let mut child = self.spawn(args, crash)?;
        deliver_stdin(&mut child, stdin, &what)?;
        finish(child, &what)
    }

    /// Runs `ordo --json ARGS` to completion at the fixed time `now_ms`.
    pub fn run_at(&self, now_ms: i64, args: &[&str]) -> Result<Run, String> {
        let what = self.shown(args);
        let mut child = self.spawn_env(args, None, &[(NOW_ENV, now_ms.to_string())])?;
        deliver_stdin(&mut child, b"", &what)?;
        finish(child, &what)
    }

    /// Runs a command that must exit 0 and returns its JSON.
    pub fn ok(&self, args: &[&str]) -> Result<Value, String> {
        self.ok_with(args, b"")
    }

    /// Runs a command with input that must exit 0 and returns its JSON.
    pub fn ok_with(&self, args: &[&str], stdin: &[u8]) -> Result<Value, String> {
        self.run(args, stdin, None)?.json_if_ok(&self.shown(args))
    }

    /// Both stores' rows, as `snapshot` prints them but for the stores'
    /// identities ([`without_store_ids`]), the inbox rows' producer and
    /// delivering store ([`without_senders`]) and the outbox rows'
    /// bookkeeping by destination ([`without_custody`]).
    pub fn snapshot(&self) -> Result<Value, String> {
        let snapshot = self.ok(&["snapshot", "--producer", "{P}", "--consumer", "{C}"])?;
        without_custody(without_store_ids(without_senders(snapshot)?))
    }

    pub fn advance(
        &self,
        flow: &str,
        expected_seq: i64,
        to: &str,
        extra: &[&str],
    ) -> Result<Value, String> {
        let seq = expected_seq.to_string();
        self.ok(&advance_args(flow, &seq, to, extra))
    }

    pub fn relay(&self, extra: &[&str]) -> Result<Value, String> {
        let mut args = RELAY.to_vec();
        args.extend_from_slice(extra);
        self.ok(&args)
    }

    pub fn apply(&self, extra: &[&str]) -> Result<Value, String> {
        let mut args = APPLY.to_vec();
        args.extend_from_slice(extra);
        self.ok(&args)
    }

    pub fn receive(&self, envelopes: &[Value]) -> Result<Value, String> {
        let mut input = String::new();
        for envelope in envelopes {
            input.push_str(&envelope.to_string());
            input.push('\n');
        }
        self.ok_with(&["receive", "--consumer", "{C}"], input.as_bytes())
    }
}

/// Writes `stdin` to a child and closes its input: the child cannot go on
/// before this, which makes the pipe a handshake.
pub fn deliver_stdin(child: &mut Child, stdin: &[u8], what: &str) -> Result<(), String> {
    let mut pipe = child
        .stdin
        .take()
        .ok_or_else(|| format!("`{what}` has no stdin"))?;
    pipe.write_all(stdin)
        .map_err(|e| format!("cannot write to `{what}`: {e}"))
}

/// The arguments of `ordo advance` on the scenario's producer file.
pub fn advance_args<'a>(
    flow: &'a str,
    expected_seq: &'a str,
    to: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "advance",
        "--producer",
        "{P}",
        "--flow",
        flow,
        "--expected-seq",
        expected_seq,
        "--to",
        to,
    ];
    args.extend_from_slice(extra);
    args
}

/// A fresh directory under `root` for one scenario.
pub fn scenario_dir(root: &Path, name: &str) -> Result<PathBuf, String> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// The JSON of `snapshot` or `status` without each side's `store_id` and
/// the producer's `producer_name`: the stores' identities are random, and
/// neither is part of what a scenario checks (every scenario's producer is
/// `default`).
pub fn without_store_ids(mut value: Value) -> Value {
    for side in ["producer", "consumer"] {
        if let Some(side) = value.get_mut(side).and_then(Value::as_object_mut) {
            side.remove("store_id");
            side.remove("producer_name");
        }
    }
    value
}

/// The JSON of `snapshot` with the default producer's inbox rows'
/// `producer` and `store_id` taken out, once seen to be delivered by the
/// scenario's producer store (relayed) or by no known store (received from
/// stdin), as every such row of a scenario is; anything else is an error.
/// A row of a named producer (the topology's) is left as it is.
pub fn without_senders(mut value: Value) -> Result<Value, String> {
    let producer_store = value["producer"]["store_id"].clone();
    let rows = (value.get_mut("consumer"))
        .and_then(|side| side.get_mut("inbox"))
        .and_then(Value::as_array_mut);
    for row in rows.into_iter().flatten() {
        let Some(row) = row.as_object_mut() else {
            continue;
        };
        if row.get("producer") != Some(&Value::from("default")) {
            continue;
        }
        row.remove("producer");
        let store = row.remove("store_id").unwrap_or(Value::Null);
        if !(store.is_null() || (store.is_string() && store == producer_store)) {
            return Err(format!(
                "snapshot: inbox row {} was delivered by store {store}, \
                 neither the producer store {producer_store} nor an unknown one",
                row.get("event_id").unwrap_or(&Value::Null),
            ));
        }
    }
    Ok(value)
}

/// The JSON of `snapshot` with each outbox row's `destinations` taken out,
/// once seen to say what the row's `accepted` says: every scenario's
/// producer delivers to one destination, `default`, whose `accepted` is
/// the row's own, and whose times and attempts no scenario checks. A row
/// with other destinations, or whose `default` says otherwise, is an error.
pub fn without_custody(mut value: Value) -> Result<Value, String> {
    let rows = (value.get_mut("producer"))
        .and_then(|side| side.get_mut("outbox"))
        .and_then(Value::as_array_mut);
    for row in rows.into_iter().flatten() {
        let Some(row) = row.as_object_mut() else {
            continue;
        };
        let destinations = row.remove("destinations").unwrap_or(Value::Null);
        let only_default = (destinations.as_object())
            .filter(|by_name| by_name.len() == 1)
            .and_then(|by_name| by_name.get("default"));
        let held = only_default.and_then(|custody| custody.get("accepted"));
        if held.is_none() || held != row.get("accepted") {
            return Err(format!(
                "snapshot: outbox row {} (accepted {}) has destinations {destinations}, \
                 not the one destination default holding it as the row says",
                row.get("event_id").unwrap_or(&Value::Null),
                row.get("accepted").unwrap_or(&Value::Null),
            ));
        }
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{without_custody, without_senders};

    fn snapshot(accepted: bool, destinations: serde_json::Value) -> serde_json::Value {
        json!({"producer": {"outbox": [
            {"event_id": "a-1", "accepted": accepted, "destinations": destinations},
        ]}, "consumer": {"inbox": []}})
    }

    /// The one destination's bookkeeping is taken out once it agrees with
    /// the row; any other destinations, or a disagreement, fail the read.
    #[test]
    fn custody_is_taken_out_only_when_default_alone_says_what_the_row_says() {
        let default = |accepted: bool| json!({"default": {"accepted": accepted, "attempts": 3}});
        assert_eq!(
            without_custody(snapshot(true, default(true))).unwrap(),
            json!({"producer": {"outbox": [{"event_id": "a-1", "accepted": true}]},
                   "consumer": {"inbox": []}})
        );
        assert!(without_custody(snapshot(false, default(false))).is_ok());
        assert!(without_custody(snapshot(false, default(true))).is_err());
        let two = json!({"default": {"accepted": false}, "billing": {"accepted": false}});
        assert!(without_custody(snapshot(false, two)).is_err());
        let elsewhere = json!({"billing": {"accepted": true}});
        assert!(without_custody(snapshot(true, elsewhere)).is_err());
        assert!(without_custody(snapshot(true, json!(null))).is_err());
        let consumer_only = json!({"consumer": {"inbox": []}});
        assert_eq!(
            without_custody(consumer_only.clone()).unwrap(),
            consumer_only
        );
    }

    /// The default producer's rows lose `producer` and `store_id` when
    /// delivered by the producer store or an unknown one; another store
    /// fails the read; a named producer's row is left as it is.
    #[test]
    fn senders_are_taken_out_only_for_the_producer_store_or_an_unknown_one() {
        let snapshot = |producer: &str, store: serde_json::Value| {
            json!({"producer": {"store_id": "p1"}, "consumer": {"inbox": [
                {"event_id": "a-1", "producer": producer, "store_id": store},
            ]}})
        };
        let bare = json!({"producer": {"store_id": "p1"}, "consumer": {"inbox": [
            {"event_id": "a-1"},
        ]}});
        assert_eq!(
            without_senders(snapshot("default", json!("p1"))).unwrap(),
            bare
        );
        assert_eq!(
            without_senders(snapshot("default", json!(null))).unwrap(),
            bare
        );
        assert!(without_senders(snapshot("default", json!("p2"))).is_err());
        let named = snapshot("orders", json!("p2"));
        assert_eq!(without_senders(named.clone()).unwrap(), named);
    }
}
