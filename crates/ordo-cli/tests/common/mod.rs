//! Helpers for the process-level tests: run the real `ordo` binary on real
//! SQLite files in a temporary directory and look at its exit status, stdout
//! and stderr.

#![allow(dead_code)]

pub mod console;
pub mod http;
pub mod process;

#[allow(unused_imports)]
use ordo_reservation::ReservationProducer;
use std::cell::Cell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use tempfile::TempDir;

/// A PostgreSQL URL with a password on loopback port 1, where nothing
/// listens.
pub const UNREACHABLE_PG: &str = "postgres://ordo:sekret@127.0.0.1:1";

/// What one run of the binary produced.
#[derive(Debug)]
pub struct Out {
    /// The exit status (`-1` if killed by a signal).
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Asserts exit 0 and parses stdout as exactly one JSON document.
    #[track_caller]
    pub fn json(&self) -> Value {
        assert_eq!(self.code, 0, "expected exit 0, got {self:#?}");
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:#?}"))
    }

    /// Asserts the invalid-input contract: exit 2, stdout empty, exactly one
    /// stderr line starting with `error: ` that mentions `needle`.
    #[track_caller]
    pub fn usage(&self, needle: &str) {
        assert_eq!(self.code, 2, "expected exit 2, got {self:#?}");
        assert_eq!(self.stdout, "", "stdout must be empty on exit 2: {self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "stderr must be exactly one line on exit 2: {self:#?}"
        );
        assert!(
            lines[0].starts_with("error: "),
            "stderr must start with `error: `: {self:#?}"
        );
        assert!(
            lines[0].contains(needle),
            "stderr must name {needle:?}: {self:#?}"
        );
    }

    /// Asserts the storage-error contract: exit 1, stdout empty, a message on stderr.
    #[track_caller]
    pub fn storage_error(&self) {
        assert_eq!(self.code, 1, "expected exit 1, got {self:#?}");
        assert_eq!(self.stdout, "", "stdout must be empty on exit 1: {self:#?}");
        assert!(
            self.stderr.starts_with("error: ") && self.stderr.trim().len() > "error: ".len(),
            "stderr must carry the underlying message: {self:#?}"
        );
    }

    /// Asserts what a lab run given [`UNREACHABLE_PG`] answers: exit 1, one
    /// line naming the server without its password.
    #[track_caller]
    pub fn unreachable_server(&self) {
        self.storage_error();
        assert_eq!(self.stderr.lines().count(), 1, "{self:#?}");
        assert!(
            self.stderr
                .contains("cannot connect to postgres://ordo@127.0.0.1:1"),
            "{self:#?}"
        );
        assert!(!self.stderr.contains("sekret"), "{self:#?}");
    }

    /// Asserts exit 0 with human-readable (non-JSON, non-empty) stdout.
    #[track_caller]
    pub fn text(&self) -> &str {
        assert_eq!(self.code, 0, "expected exit 0, got {self:#?}");
        assert!(!self.stdout.trim().is_empty(), "text output is empty");
        assert!(
            serde_json::from_str::<Value>(&self.stdout).is_err(),
            "text output must not be JSON: {self:#?}"
        );
        &self.stdout
    }
}

/// Runs `ordo ARGS` with `stdin` as its standard input and, when `now_ms`
/// is given, `ORDO_NOW_MS` set so that every time the binary reads or
/// prints is exact. A crash point set in the test's own environment is
/// never passed on.
pub fn run_at(now_ms: Option<i64>, args: &[&str], stdin: &[u8]) -> Out {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ordo"));
    command.args(args).env_remove("ORDO_CRASH_POINT");
    if let Some(now_ms) = now_ms {
        command.env("ORDO_NOW_MS", now_ms.to_string());
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the ordo binary starts");
    {
        let mut input = child.stdin.take().expect("stdin is piped");
        // The binary may exit (usage error) before reading: ignore a broken pipe.
        let _ = input.write_all(stdin);
    }
    let output = child.wait_with_output().expect("the ordo binary runs");
    Out {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}

/// Runs `ordo ARGS` with `stdin` as its standard input.
pub fn run_bytes(args: &[&str], stdin: &[u8]) -> Out {
    run_at(None, args, stdin)
}

/// Runs `ordo ARGS` with empty stdin.
pub fn run(args: &[&str]) -> Out {
    run_bytes(args, b"")
}

/// A compact envelope as wire text.
pub fn envelope(
    event_id: &str,
    flow_id: &str,
    seq: i64,
    schema: i64,
    event_type: &str,
    payload: Value,
) -> String {
    json!({
        "event_id": event_id,
        "flow_id": flow_id,
        "seq": seq,
        "schema_version": schema,
        "type": event_type,
        "payload": payload,
    })
    .to_string()
}

/// A schema-1 reservation envelope as the producer would emit it.
pub fn reservation(flow_id: &str, seq: i64, event_type: &str, amount: i64) -> String {
    envelope(
        &format!("{flow_id}-{seq}"),
        flow_id,
        seq,
        1,
        event_type,
        json!({ "amount": amount }),
    )
}

/// A temporary directory with a producer and a consumer path in it (the
/// files themselves are not created), and the clock its commands run at:
/// the system's until [`Lab::at`] fixes one.
pub struct Lab {
    pub dir: TempDir,
    pub p: String,
    pub c: String,
    now_ms: Cell<Option<i64>>,
}

/// The contents of some files, compared byte for byte; a difference is
/// reported by file and offset, not by dumping the bytes.
pub struct Files(pub Vec<(String, Option<Vec<u8>>)>);

impl Files {
    /// The files at these paths, now.
    pub fn of(paths: &[&str]) -> Files {
        Files(paths.iter().map(|p| (p.to_string(), bytes(p))).collect())
    }

    /// Asserts that every file is byte-identical to `before` (and exists
    /// exactly when it existed before).
    #[track_caller]
    pub fn assert_unchanged(&self, before: &Files, context: &str) {
        for ((path, now), (_, then)) in self.0.iter().zip(&before.0) {
            match (then, now) {
                (None, None) => {}
                (None, Some(_)) => panic!("{context}: {path} was created"),
                (Some(_), None) => panic!("{context}: {path} was removed"),
                (Some(then), Some(now)) => {
                    if then != now {
                        let offset = then
                            .iter()
                            .zip(now.iter())
                            .position(|(a, b)| a != b)
                            .unwrap_or(then.len().min(now.len()));
                        panic!(
                            "{context}: {path} changed ({} -> {} bytes, first difference at offset {offset})",
                            then.len(),
                            now.len()
                        );
                    }
                }
            }
        }
    }
}

/// The bytes of a file, or `None` if it does not exist.
pub fn bytes(path: &str) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("cannot read {path}: {e}"),
    }
}

impl Lab {
    pub fn new() -> Lab {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let p = path_str(&dir.path().join("producer.db"));
        let c = path_str(&dir.path().join("consumer.db"));
        Lab {
            dir,
            p,
            c,
            now_ms: Cell::new(None),
        }
    }

    /// A lab whose stores are `p` and `c` (files or PostgreSQL URLs; one
    /// database may hold both).
    pub fn with_stores(p: &str, c: &str) -> Lab {
        Lab {
            p: p.to_owned(),
            c: c.to_owned(),
            ..Lab::new()
        }
    }

    /// A path inside the lab's directory.
    pub fn path(&self, name: &str) -> String {
        path_str(&self.dir.path().join(name))
    }

    /// Fixes the clock (`ORDO_NOW_MS`) of the commands run after this.
    pub fn at(&self, now_ms: i64) -> &Lab {
        self.now_ms.set(Some(now_ms));
        self
    }

    /// `ordo ARGS` at the lab's clock, with empty stdin.
    pub fn run(&self, args: &[&str]) -> Out {
        self.run_bytes(args, b"")
    }

    /// `ordo ARGS` at the lab's clock, with `stdin` as its standard input.
    pub fn run_bytes(&self, args: &[&str], stdin: &[u8]) -> Out {
        run_at(self.now_ms.get(), args, stdin)
    }

    /// `ordo COMMAND --json --producer P --consumer C EXTRA`.
    pub fn run_both(&self, command: &str, extra: &[&str]) -> Out {
        let mut args = vec![
            command,
            "--json",
            "--producer",
            &self.p,
            "--consumer",
            &self.c,
        ];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// `ordo init --json` on both files.
    pub fn init(&self) -> Value {
        self.run_both("init", &[]).json()
    }

    /// `ordo advance --json`, returning the whole output.
    pub fn advance_out(
        &self,
        flow: &str,
        expected_seq: i64,
        to: &str,
        quantity: Option<i64>,
        schema: Option<i64>,
    ) -> Out {
        let expected = expected_seq.to_string();
        let quantity = quantity.map(|q| q.to_string());
        let schema = schema.map(|s| s.to_string());
        let mut args = advance_args(&self.p, flow, &expected, to);
        args.push("--json");
        if let Some(q) = &quantity {
            args.extend(["--quantity", q]);
        }
        if let Some(s) = &schema {
            args.extend(["--schema", s]);
        }
        self.run(&args)
    }

    /// `ordo advance --json` expected to exit 0; its JSON.
    #[track_caller]
    pub fn advance(&self, flow: &str, expected_seq: i64, to: &str, quantity: Option<i64>) -> Value {
        self.advance_out(flow, expected_seq, to, quantity, None)
            .json()
    }

    /// Advances `flow` through all three steps with `quantity`.
    #[track_caller]
    pub fn full_flow(&self, flow: &str, quantity: i64) {
        for (seq, to) in ["reserved", "confirmed", "released"].iter().enumerate() {
            let out = self.advance(flow, seq as i64, to, Some(quantity));
            assert_eq!(out["outcome"], "committed", "{out}");
        }
    }

    /// `ordo relay --json` with extra arguments.
    pub fn relay_out(&self, extra: &[&str]) -> Out {
        self.run_both("relay", extra)
    }

    #[track_caller]
    pub fn relay(&self, extra: &[&str]) -> Value {
        self.relay_out(extra).json()
    }

    /// `ordo receive --json` with `input` on stdin.
    pub fn receive_out(&self, input: &[u8]) -> Out {
        self.run_bytes(&["receive", "--json", "--consumer", &self.c], input)
    }

    #[track_caller]
    pub fn receive(&self, input: &str) -> Value {
        self.receive_out(input.as_bytes()).json()
    }

    /// `ordo apply --json` with extra arguments.
    pub fn apply_out(&self, extra: &[&str]) -> Out {
        let mut args = vec!["apply", "--json", "--consumer", &self.c];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    #[track_caller]
    pub fn apply(&self, extra: &[&str]) -> Value {
        self.apply_out(extra).json()
    }

    /// `ordo snapshot --json`.
    #[track_caller]
    pub fn snapshot(&self) -> Value {
        self.run_both("snapshot", &[]).json()
    }

    /// The bytes of both database files (`None` for a missing one).
    pub fn files(&self) -> Files {
        Files::of(&[&self.p, &self.c])
    }

    /// Asserts that neither database file exists.
    #[track_caller]
    pub fn assert_no_files(&self) {
        assert!(!Path::new(&self.p).exists(), "{} was created", self.p);
        assert!(!Path::new(&self.c).exists(), "{} was created", self.c);
    }
}

/// A certificate for 127.0.0.1 signed by its own key, in a lab's directory.
pub struct SelfSigned {
    /// The certificate's PEM file.
    pub cert: String,
    /// The key's PEM file, readable by its owner alone.
    pub key: String,
    /// The certificate, DER-encoded.
    pub der: Vec<u8>,
}

impl SelfSigned {
    /// Writes `cert.pem` and `key.pem` into `lab`'s directory.
    pub fn new(lab: &Lab) -> SelfSigned {
        use std::os::unix::fs::PermissionsExt;
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let (cert, key) = (lab.path("cert.pem"), lab.path("key.pem"));
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        SelfSigned {
            cert,
            key,
            der: certified.cert.der().to_vec(),
        }
    }
}

/// `ordo advance --producer PRODUCER --flow FLOW --expected-seq EXPECTED
/// --to TO`, to which a caller adds `--json`, `--quantity` and the like.
pub fn advance_args<'a>(
    producer: &'a str,
    flow: &'a str,
    expected_seq: &'a str,
    to: &'a str,
) -> Vec<&'a str> {
    vec![
        "advance",
        "--producer",
        producer,
        "--flow",
        flow,
        "--expected-seq",
        expected_seq,
        "--to",
        to,
    ]
}

/// `ordo advance --producer PRODUCER --flow FLOW --expected-seq 0 --to
/// reserved --quantity 1` (a new flow, reserved), to which a caller adds
/// `--json` and the like.
pub fn first_advance<'a>(producer: &'a str, flow: &'a str) -> Vec<&'a str> {
    let mut args = advance_args(producer, flow, "0", "reserved");
    args.extend(["--quantity", "1"]);
    args
}

/// The `(event_id, receipt)` of every delivery of a relay's JSON report.
#[track_caller]
pub fn receipts(report: &Value) -> Vec<(String, String)> {
    report["deliveries"]
        .as_array()
        .expect("a list of deliveries")
        .iter()
        .map(|d| {
            (
                d["event_id"].as_str().unwrap().to_owned(),
                d["receipt"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The keys of a JSON object, sorted.
#[track_caller]
pub fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// The names of the scenarios of an experiment's JSON report, in its order.
#[track_caller]
pub fn scenario_names(report: &Value) -> Vec<&str> {
    report["scenarios"]
        .as_array()
        .expect("a list of scenarios")
        .iter()
        .map(|s| s["name"].as_str().expect("a scenario's name"))
        .collect()
}

/// `names`, sorted (to compare with [`keys`]).
pub fn sorted<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let mut names = names.to_vec();
    names.sort_unstable();
    names
}

/// `value` (the JSON of `status` or `snapshot`) without each side's
/// `store_id`, after checking that each side given has one (32 lowercase
/// hex digits): identities are random, and no part of what a test that
/// compares the rest looks at; and without the producer's
/// `producer_name`, after checking that it is `default` (every store of
/// these tests is created without a name).
#[track_caller]
pub fn without_store_ids(mut value: Value) -> Value {
    for side in ["producer", "consumer"] {
        if let Some(side) = value.get_mut(side).and_then(Value::as_object_mut) {
            let id = side.remove("store_id").expect("a store id");
            let id = id.as_str().expect("a store id is text");
            assert!(
                id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{id}"
            );
        }
    }
    if let Some(producer) = value.get_mut("producer").and_then(Value::as_object_mut) {
        assert_eq!(
            producer.remove("producer_name"),
            Some(Value::from("default"))
        );
    }
    value
}

/// The row of `rows` whose `key` is `value`.
#[track_caller]
pub fn row<'v>(rows: &'v Value, key: &str, value: &str) -> &'v Value {
    rows.as_array()
        .expect("an array of rows")
        .iter()
        .find(|r| r[key] == value)
        .unwrap_or_else(|| panic!("no row with {key} = {value} in {rows}"))
}

fn path_str(path: &Path) -> String {
    path.to_str().expect("temporary paths are UTF-8").to_owned()
}

/// Asserts the consumer side of `snapshot`: its projection rows, and an
/// effect for each `(flow, seq)` of `effects`, in order, each of event id
/// `FLOW-SEQ`.
#[track_caller]
pub fn assert_applied(snapshot: &Value, projection: Value, effects: &[(&str, i64)]) {
    let effects: Vec<Value> = effects
        .iter()
        .map(
            |(flow, seq)| json!({"flow_id": flow, "producer": "default", "seq": seq, "event_id": format!("{flow}-{seq}")}),
        )
        .collect();
    assert_eq!(snapshot["consumer"]["projection"], projection);
    assert_eq!(snapshot["consumer"]["effects"], Value::Array(effects));
}

/// Runs `ordo --json bench --dir DIR ARGS` in a fresh directory, which the
/// bench must leave empty.
pub fn bench(args: &[&str]) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_string();
    let mut all = vec!["--json", "bench", "--dir", dir_arg.as_str()];
    all.extend_from_slice(args);
    let out = run(&all);
    // The temporary files go with the run.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "bench left files behind: {left:?}");
    out
}

/// The path of `name` inside `dir`, as text.
pub fn join(dir: &Path, name: &str) -> String {
    path_str(&PathBuf::from(dir).join(name))
}

/// Spawns `command` (the binary of a long-running mode, stdout and stderr
/// piped here), collects its stderr on a thread, and reads the address from
/// its first stdout line, `listening on ADDR`.
pub fn spawn_listening(
    command: &mut Command,
) -> (
    std::process::Child,
    String,
    std::sync::Arc<std::sync::Mutex<String>>,
) {
    use std::io::Read;
    let mut child = command
        .env_remove("ORDO_CRASH_POINT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the ordo binary starts");
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut pipe = child.stderr.take().expect("stderr is piped");
    let sink = std::sync::Arc::clone(&stderr);
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        sink.lock().unwrap().push_str(&text);
    });
    let addr = process::listening_addr(child.stdout.as_mut().expect("stdout is piped"))
        .unwrap_or_else(|line| panic!("first line {line:?}, stderr {:?}", stderr.lock().unwrap()));
    (child, addr, stderr)
}

/// `GET path` of the server at `addr` over a plain socket; the whole
/// response, which must be a 200.
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// `ordo ARGS` as a process of its own, stdout piped here and stderr
/// dropped (a crash point set in the test's environment is never passed on).
pub fn spawn(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(args)
        .env_remove("ORDO_CRASH_POINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ordo starts")
}

/// The lines of `pipe` as they come, read on a thread of their own.
pub fn line_reader(pipe: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    receive
}

/// Runs `ordo COMMAND FLAGS` for each case of `(FLAGS, phrase)`: the
/// invalid-input contract naming the phrase ([`Out::usage`]), and the
/// password `sekret` never printed.
#[track_caller]
pub fn refuses_each(command: &[&str], cases: &[(Vec<String>, &str)]) {
    for (flags, needle) in cases {
        let mut args = command.to_vec();
        args.extend(flags.iter().map(String::as_str));
        let out = run(&args);
        out.usage(needle);
        assert!(!out.stderr.contains("sekret"), "{flags:?}: {out:#?}");
    }
}

/// `ordo soak --seconds SECONDS --flows FLOWS --seed SEED EXTRA --json`:
/// its report, whose verdict must be `ok`.
#[track_caller]
pub fn soak_ok(seconds: u32, flows: u32, seed: u32, extra: &[&str]) -> Value {
    let (seconds, flows, seed) = (seconds.to_string(), flows.to_string(), seed.to_string());
    let mut args = vec![
        "soak",
        "--seconds",
        &seconds,
        "--flows",
        &flows,
        "--seed",
        &seed,
    ];
    args.extend_from_slice(extra);
    args.push("--json");
    let report = run(&args).json();
    assert_eq!(report["verdict"], "ok", "{report}");
    report
}

/// Advances `flow` on `producer` from `expected_seq` to `to`, and checks
/// that it committed.
pub fn advance_committed(producer: &str, flow: &str, expected_seq: i64, to: &str, quantity: u32) {
    let (expected_seq, quantity) = (expected_seq.to_string(), quantity.to_string());
    let out = run(&[
        "advance",
        "--json",
        "--producer",
        producer,
        "--flow",
        flow,
        "--expected-seq",
        &expected_seq,
        "--to",
        to,
        "--quantity",
        &quantity,
    ]);
    assert_eq!(out.json()["outcome"], "committed", "{out:#?}");
}

/// A new flow `flow` on `producer`, reserved.
pub fn advance_new(producer: &str, flow: &str) {
    advance_committed(producer, flow, 0, "reserved", 2);
}

/// A running `ordo serve` on a consumer file; killed when dropped.
pub struct Serve {
    _child: process::Process,
    /// The address it listens on.
    pub addr: String,
}

impl Serve {
    /// Starts `ordo serve --consumer consumer` on a free loopback port,
    /// with `extra` flags.
    pub fn start(consumer: &str, extra: &[&str]) -> Serve {
        let (child, addr) = process::start_listening(
            Command::new(env!("CARGO_BIN_EXE_ordo"))
                .args(["serve", "--consumer", consumer, "--listen", "127.0.0.1:0"])
                .args(extra)
                .env_remove("ORDO_CRASH_POINT")
                .stderr(Stdio::null()),
            "ordo serve",
        );
        Serve {
            _child: child,
            addr,
        }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// `ordo relay --json` from the lab's producer to `url`, with `extra` flags.
pub fn relay_to(lab: &Lab, url: &str, extra: &[&str]) -> Out {
    let base = ["relay", "--json", "--producer", &lab.p, "--to", url];
    lab.run(&[&base[..], extra].concat())
}

/// The producer's `status --json`.
pub fn producer_status(lab: &Lab) -> Value {
    lab.run(&["status", "--json", "--producer", &lab.p]).json()["producer"].clone()
}

/// Asserts the producer's backlog and quarantined counts in `status`.
#[track_caller]
pub fn assert_backlog(lab: &Lab, backlog: u64, quarantined: u64) {
    let status = producer_status(lab);
    assert_eq!(
        (&status["backlog"], &status["quarantined"]),
        (&json!(backlog), &json!(quarantined)),
        "{status}"
    );
}
