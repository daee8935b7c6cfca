//! Runs an [`Operation`] under every fault point and checks, after each,
//! what must hold: the files pass `PRAGMA integrity_check`, the state is
//! the one before the operation or the one after it (never a mix inside a
//! file, never custody without the receive), a returned error has the
//! expected kind, and running the operation again without a fault ends in
//! the state of a fault-free run.
//!
//! Every run starts from a copy of one template directory, so runs are
//! independent and cheap.

use std::ffi::c_int;
use std::path::Path;

use ordo_core::{ErrorKind, StoreError};
use rusqlite::{ffi, Connection};
use tempfile::TempDir;

use crate::ops::{self, Operation, Snapshot, FILES};
use crate::{Fault, FaultPlan, Tear};

/// The most fault points tried per operation and fault kind; an operation
/// that still hits its fault after this many is a failure.
pub const FAULT_POINTS_MAX: u64 = 500;

/// The tears tried at every power-loss point.
pub const TEARS: [Tear; 6] = [
    Tear::Drop,
    Tear::Keep(usize::MAX),
    Tear::Keep(1),
    Tear::Keep(3),
    Tear::Torn {
        kept: 0,
        sectors: 1,
    },
    Tear::Torn {
        kept: 2,
        sectors: 3,
    },
];

/// An operation's starting files and the states before and after a
/// fault-free run.
pub struct Template {
    op: Operation,
    dir: TempDir,
    before: Snapshot,
    after: Snapshot,
    /// Syncs of a fault-free run.
    syncs: u64,
    /// Writes of a fault-free run.
    writes: u64,
}

impl Template {
    /// Sets the operation's files up and runs it once without a fault.
    pub fn build(op: Operation) -> Template {
        let dir = tempfile::tempdir().expect("a temporary directory");
        crate::install().expect("install the fault-injecting VFS");
        op.setup(dir.path()).expect("setup");
        let before = ops::state(dir.path()).expect("state before");
        let run = Run::new(&dir);
        op.run(run.path()).expect("a fault-free run");
        let counts = run.plan.counts();
        let after = ops::state(run.path()).expect("state after");
        assert_ne!(
            before,
            after,
            "{}: the operation changes nothing",
            op.name()
        );
        Template {
            op,
            dir,
            before,
            after,
            syncs: counts.syncs,
            writes: counts.writes,
        }
    }

    /// Syncs of a fault-free run (counted from opening the stores to closing
    /// them).
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    /// Writes of a fault-free run.
    pub fn writes(&self) -> u64 {
        self.writes
    }
}

/// A copy of a template's files in a fresh armed directory.
struct Run {
    dir: TempDir,
    plan: FaultPlan,
}

impl Run {
    fn new(template: &TempDir) -> Run {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for name in FILES {
            let from = template.path().join(name);
            let wal = template.path().join(format!("{name}-wal"));
            assert!(!wal.exists(), "a template's files are checkpointed");
            std::fs::copy(&from, dir.path().join(name)).expect("copy a template file");
        }
        let plan = FaultPlan::arm(dir.path());
        Run { dir, plan }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// `PRAGMA integrity_check` of every file of `dir` answers `ok`.
pub fn assert_integrity(dir: &Path) {
    for name in FILES {
        let path = dir.join(name);
        let conn = Connection::open(&path).expect("open for integrity_check");
        let mut stmt = conn
            .prepare("PRAGMA integrity_check")
            .expect("prepare integrity_check");
        let rows: Vec<String> = stmt
            .query_map([], |row| row.get(0))
            .and_then(|rows| rows.collect())
            .expect("run integrity_check");
        assert_eq!(rows, vec!["ok".to_owned()], "{}", path.display());
    }
}

/// What the operation's result allows the state to be.
fn assert_allowed(template: &Template, got: &Snapshot, result: &Result<(), StoreError>, at: &str) {
    let (before, after) = (&template.before, &template.after);
    let name = template.op.name();
    assert!(
        got.producer == before.producer || got.producer == after.producer,
        "{name} {at}: the producer file is neither before nor after:\n{:#?}",
        got.producer
    );
    assert!(
        got.consumer == before.consumer || got.consumer == after.consumer,
        "{name} {at}: the consumer file is neither before nor after:\n{:#?}",
        got.consumer
    );
    if before.producer != after.producer && got.producer == after.producer {
        assert_eq!(
            got.consumer, after.consumer,
            "{name} {at}: the producer moved on but the consumer did not"
        );
    }
    if result.is_ok() {
        let (producer, consumer) = template.op.durable_on_ok();
        assert!(
            !producer || got.producer == after.producer,
            "{name} {at}: returned Ok, producer change missing"
        );
        assert!(
            !consumer || got.consumer == after.consumer,
            "{name} {at}: returned Ok, consumer change missing"
        );
    }
}

/// After a faulted run whose connections are all closed: integrity, an
/// allowed state, the invariants, and convergence when run again.
fn check_recovery(template: &Template, run: &Run, result: &Result<(), StoreError>, at: &str) {
    assert_eq!(run.plan.files_open(), 0, "every connection is closed");
    run.plan.set(Fault::None);
    assert_integrity(run.path());
    let got = ops::state(run.path()).expect("state after a fault");
    assert_allowed(template, &got, result, at);
    if template.op.keeps_applied_rows() {
        ops::check_invariants(run.path()).expect("read the consumer");
    }
    if got != template.after {
        template
            .op
            .run(run.path())
            .unwrap_or_else(|e| panic!("{} {at}: run again: {e}", template.op.name()));
    }
    let end = ops::state(run.path()).expect("state after running again");
    assert_eq!(
        end,
        template.after,
        "{} {at}: does not converge",
        template.op.name()
    );
    assert_integrity(run.path());
}

/// Runs the operation with `fault(n)` for n = 1, 2, … until a run does not
/// hit its fault; after each run that did, checks the recovery and that an
/// error has `kind`. Returns how many fault points were injected.
pub fn fault_every_point(
    template: &Template,
    fault: impl Fn(u64) -> Fault,
    kind: ErrorKind,
) -> u64 {
    for n in 1..=FAULT_POINTS_MAX {
        let run = Run::new(&template.dir);
        run.plan.set(fault(n));
        let result = template.op.run(run.path());
        let at = format!("at {:?}", fault(n));
        if run.plan.counts().injected == 0 {
            result.unwrap_or_else(|e| {
                panic!("{} {at}: failed without a fault: {e}", template.op.name())
            });
            assert_eq!(ops::state(run.path()).expect("state"), template.after);
            return n - 1;
        }
        if let Err(e) = &result {
            assert_eq!(e.kind(), kind, "{} {at}: {e}", template.op.name());
        }
        check_recovery(template, &run, &result, &at);
    }
    panic!(
        "{}: still hitting the fault after {FAULT_POINTS_MAX} points",
        template.op.name()
    );
}

/// Write faults with `code` at every write of the operation.
pub fn write_faults(template: &Template, code: c_int, kind: ErrorKind) -> u64 {
    fault_every_point(template, |nth| Fault::FailWrite { nth, code }, kind)
}

/// Sync faults (`SQLITE_IOERR_FSYNC`) at every sync of the operation.
pub fn sync_faults(template: &Template) -> u64 {
    fault_every_point(
        template,
        |nth| Fault::FailSync {
            nth,
            code: ffi::SQLITE_IOERR_FSYNC,
        },
        ErrorKind::CommitOutcomeUnknown,
    )
}

/// The operation on a read-only disk: it fails as `ReadOnly` and changes
/// nothing. Returns how many writes were refused.
pub fn read_only(template: &Template) -> u64 {
    let run = Run::new(&template.dir);
    run.plan.set(Fault::ReadOnly);
    let result = template.op.run(run.path());
    let refused = run.plan.counts().injected;
    assert!(refused > 0, "{}: wrote nothing", template.op.name());
    let error = result
        .as_ref()
        .expect_err("a write on a read-only disk fails");
    assert_eq!(error.kind(), ErrorKind::ReadOnly, "{error}");
    run.plan.set(Fault::None);
    assert_eq!(
        ops::state(run.path()).expect("state"),
        template.before,
        "{}: a refused write changed something",
        template.op.name()
    );
    check_recovery(template, &run, &result, "read-only");
    refused
}

/// Cuts the power at every sync of the operation (and once after it), with
/// every tear of [`TEARS`]; after each, checks the recovery. Returns how
/// many power-loss points were tried.
pub fn power_loss_every_sync(template: &Template) -> u64 {
    let mut points = 0;
    for nth in 1..=template.syncs + 1 {
        for tear in TEARS {
            let run = Run::new(&template.dir);
            run.plan.set(Fault::PowerCut { nth });
            let result = template.op.run(run.path());
            let cut = run.plan.counts().injected > 0;
            assert_eq!(
                cut,
                nth <= template.syncs,
                "{}: the syncs of a run are not repeatable",
                template.op.name()
            );
            run.plan
                .simulate_power_loss(tear)
                .expect("simulate a power loss");
            let at = format!("power cut at sync {nth} with {tear:?}");
            check_recovery(template, &run, &result, &at);
            points += 1;
        }
    }
    points
}
