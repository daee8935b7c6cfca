//! docs/guide-many-services.md runs as written: every ```sh block of it,
//! in order, as one bash script, against the `ordo` binary of this build.
//!
//! The script is the guide's text with three rewrites only: the first
//! block's `cargo build` and `export PATH=` lines become a PATH export
//! naming this build's binary's directory, `/tmp/guide` a fresh temporary
//! directory, and the port 8441 a free port. Any command of a block that
//! fails (one not ending in `|| echo ...`) fails the script and so the
//! test, which then prints the script's stdout and stderr (each block
//! preceded by a `### block N` line, each command traced on stderr).

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The guide's page, relative to the repository's root.
const GUIDE: &str = "docs/guide-many-services.md";

/// The guide's own directory and port, which the test replaces.
const GUIDE_DIR: &str = "/tmp/guide";
const GUIDE_PORT: &str = "8441";

/// How long the whole script may take before it is killed.
const DEADLINE: Duration = Duration::from_secs(300);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The body of every ```sh block of `text`, in order.
fn sh_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        match current.as_mut() {
            None if fence && line.trim_start().trim_start_matches('`').trim() == "sh" => {
                current = Some(String::new());
            }
            None => {}
            Some(_) if fence => blocks.push(current.take().expect("inside a block")),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "{GUIDE}: a ```sh block is never closed");
    blocks
}

/// The first block with its `cargo build` and `export PATH=` lines replaced
/// by one PATH export naming `bin_dir`.
fn without_build(block: &str, bin_dir: &Path) -> String {
    let mut out = String::new();
    let (mut build, mut path) = (false, false);
    for line in block.lines() {
        if line.starts_with("cargo build") {
            build = true;
        } else if line.starts_with("export PATH=") {
            path = true;
            out.push_str(&format!("export PATH={}:\"$PATH\"\n", quoted(bin_dir)));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(
        build && path,
        "{GUIDE}: the first ```sh block no longer builds ordo and puts it on PATH \
         (`cargo build` {build}, `export PATH=` {path}); update this test:\n{block}"
    );
    out
}

/// `path` as one single-quoted shell word.
fn quoted(path: &Path) -> String {
    let text = path.to_str().expect("a UTF-8 path");
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("its address")
        .port()
}

/// The guide's script: its blocks, rewritten, each after a `### block N`
/// line on stdout and stderr, under `set -euo pipefail` and `set -x`, with
/// a trap that stops the server the guide started, however the script ends.
fn script(blocks: &[String], dir: &Path, port: u16, bin_dir: &Path) -> String {
    let dir_text = dir.to_str().expect("a UTF-8 path");
    assert!(
        !dir_text.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)),
        "the temporary directory {dir_text:?} needs no quoting"
    );
    let mut script = String::from("set -euo pipefail\n");
    script.push_str(&format!(
        "trap 'kill \"$(cat {dir_text}/serve.pid 2>/dev/null)\" 2>/dev/null || true' EXIT\n"
    ));
    script.push_str("PS4='+ '\nset -x\n");
    for (n, block) in blocks.iter().enumerate() {
        let block = if n == 0 {
            without_build(block, bin_dir)
        } else {
            block.clone()
        };
        let block = block
            .replace(GUIDE_DIR, dir_text)
            .replace(GUIDE_PORT, &port.to_string());
        script.push_str(&format!(
            "{{ set +x; }} 2>/dev/null; echo '### block {n}'; echo '### block {n}' >&2; set -x\n"
        ));
        script.push_str(&block);
    }
    script.push_str("{ set +x; } 2>/dev/null; echo '### end'\n");
    script
}

/// What the script printed and how it ended.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    script: String,
    /// The server's log, `serve.log` of the guide's directory.
    serve_log: String,
}

impl Run {
    /// The stdout of block `n` (from its `### block N` line to the next).
    fn block(&self, n: usize) -> &str {
        let start = format!("### block {n}\n");
        let from = self
            .stdout
            .find(&start)
            .unwrap_or_else(|| panic!("block {n} never ran\n{self}"))
            + start.len();
        let rest = &self.stdout[from..];
        &rest[..rest.find("\n### ").map_or(rest.len(), |end| end + 1)]
    }

    /// Asserts that block `n`'s stdout has a line containing `needle`.
    #[track_caller]
    fn says(&self, n: usize, needle: &str) {
        assert!(
            self.block(n).lines().any(|line| line.contains(needle)),
            "block {n} of {GUIDE} does not print {needle:?}\n{self}"
        );
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit status {:?}\n--- script ---\n{}\n--- stdout ---\n{}\n--- stderr ---\n{}\
             \n--- serve.log ---\n{}",
            self.code, self.script, self.stdout, self.stderr, self.serve_log
        )
    }
}

/// Runs `script` with bash in a process group of its own; the group is
/// killed when the script ends or after [`DEADLINE`].
fn run(script: String, cwd: &Path, dir: &Path) -> Run {
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(cwd)
        .env_remove("ORDO_CRASH_POINT")
        .env_remove("ORDO_NOW_MS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash starts");
    let pgid = i32::try_from(child.id()).expect("a pid");
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout is piped")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr is piped")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if started.elapsed() > DEADLINE {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever the script left running (it should be nothing: the trap
    // stops the server) goes with its group.
    // SAFETY: kill(2) with a process group id this test created.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    let _ = child.wait();
    Run {
        code: status.and_then(|status| status.code()),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
        script,
        serve_log: std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default(),
    }
}

#[test]
fn the_many_services_guide_runs_as_written() {
    let text = std::fs::read_to_string(root().join(GUIDE)).expect("the guide is readable");
    let blocks = sh_blocks(&text);
    assert!(
        blocks.len() >= 8,
        "{GUIDE} has {} ```sh blocks",
        blocks.len()
    );
    for needle in [GUIDE_DIR, GUIDE_PORT] {
        assert!(text.contains(needle), "{GUIDE} no longer uses {needle}");
    }
    let ordo = PathBuf::from(env!("CARGO_BIN_EXE_ordo"));
    let bin_dir = ordo.parent().expect("the binary's directory");
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path().join("guide");
    let run = run(
        script(&blocks, &dir, free_port(), bin_dir),
        tmp.path(),
        &dir,
    );

    assert_eq!(run.code, Some(0), "{GUIDE} does not run as written\n{run}");
    assert!(run.stdout.ends_with("### end\n"), "{run}");

    // Which block is which, as the guide orders them.
    let block = |needle: &str| {
        blocks
            .iter()
            .position(|block| block.contains(needle))
            .unwrap_or_else(|| panic!("no ```sh block of {GUIDE} has {needle:?}"))
    };
    let stores = block("ordo destination add --producer /tmp/guide/orders.db shipping");
    let one_flow_id = block("--producer-name payments --flow o-1");
    let keys = block("unbound.keys");
    let rewound = block("cp -p /tmp/guide/backup/");
    let abandon = block("outbox abandon");
    let rebuilt = block("shipping-2");

    // The last destination stays.
    run.says(
        stores,
        "refused (exit 2): the last destination cannot be removed",
    );
    // Both producers' o-1 are stored at shipping, each in its own flow
    // (and applied there, by `serve --apply`).
    run.says(
        one_flow_id,
        "o-1 of producer orders seq 1 reserved: applied",
    );
    run.says(
        one_flow_id,
        "o-1 of producer payments seq 1 reserved: applied",
    );
    // A key signs for its own producer only.
    run.says(keys, "refused (exit 2): orders' key");
    run.says(keys, "refused (exit 1): 403");
    // A restored producer: shipping refuses the new o-3, the alarm fires.
    run.says(rewound, "producer_rewound");
    run.says(rewound, "breach (exit 3)");
    // After the abandon the flow leaves the alarms: the block ends in
    // `status --max-rewound 0` with no `|| echo`, which under `set -e`
    // ends the script unless it exits 0.
    run.says(abandon, "abandon");
    let last = blocks[abandon]
        .lines()
        .rfind(|line| !line.trim().is_empty());
    assert!(
        last.is_some_and(|line| line.starts_with("ordo status")
            && line.contains("--max-rewound 0")
            && !line.contains("||")),
        "{GUIDE}: the abandon block no longer ends in a status that must pass: {last:?}"
    );
    // The rebuilt consumer's store is not the one the destination knows.
    run.says(rebuilt, "refused (exit 1): another consumer");
    // The refused relay delivered nothing there: the new destination's
    // relay hands o-5 over first, `accepted`.
    run.says(rebuilt, "o-5 seq 1: accepted");
}
