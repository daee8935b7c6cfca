//! What the fault layer does to the files under an armed directory: which
//! call fails, what each call is counted as, and the undo journal of every
//! write since a file's last successful sync, from which a power loss is
//! simulated. Everything here is safe code over [`RawFile`]; the VFS in
//! `vfs.rs` feeds it the calls SQLite makes.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::ffi;

/// The granularity of a torn write: the bytes of a write that reach the disk
/// before the power goes are a whole number of these from its start.
pub const TORN_SECTOR_LEN_BYTES: u64 = 512;

/// A fault to inject under an armed directory. Call numbers count from the
/// moment the fault is set (see [`FaultPlan::set`]), starting at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing fails; calls are only counted and journaled.
    None,
    /// The `nth` write (`xWrite`) fails with `code` and writes nothing; the
    /// writes before and after it succeed.
    FailWrite {
        /// Which write fails.
        nth: u64,
        /// The code it fails with, e.g. `SQLITE_IOERR_WRITE` or `SQLITE_FULL`.
        code: c_int,
    },
    /// The `nth` sync (`xSync`) fails with `code` and syncs nothing; the
    /// syncs before and after it succeed.
    FailSync {
        /// Which sync fails.
        nth: u64,
        /// The code it fails with, e.g. `SQLITE_IOERR_FSYNC`.
        code: c_int,
    },
    /// Every write and truncation fails with `SQLITE_READONLY`.
    ReadOnly,
    /// The power goes at the `nth` sync: that sync does not happen, and from
    /// then on every write, truncation, sync and deletion fails (with
    /// `SQLITE_IOERR_*`) without touching the disk, until
    /// [`FaultPlan::simulate_power_loss`].
    PowerCut {
        /// The sync at which the power goes.
        nth: u64,
    },
}

/// What the files under an armed directory saw since the fault was set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Writes (`xWrite`), failed ones included.
    pub writes: u64,
    /// Syncs (`xSync`), failed ones included.
    pub syncs: u64,
    /// Truncations (`xTruncate`), failed ones included.
    pub truncations: u64,
    /// Deletions (`xDelete`), failed ones included.
    pub deletions: u64,
    /// Calls made to fail by the fault.
    pub injected: u64,
}

/// Which unsynced writes of each file survive a simulated power loss. A
/// file's writes are counted in the order they were made since its last
/// successful sync; truncations count as writes and are never torn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tear {
    /// Every file is exactly as it was at its last successful sync.
    Drop,
    /// The first `n` unsynced writes of each file reached the disk, the
    /// others did not (`usize::MAX`: all of them, as after a process crash).
    Keep(usize),
    /// The first `kept` unsynced writes of each file reached the disk, and
    /// of the next one only its first `sectors` sectors of
    /// [`TORN_SECTOR_LEN_BYTES`].
    Torn {
        /// Whole writes kept.
        kept: usize,
        /// Sectors of the next write kept.
        sectors: u64,
    },
}

impl Tear {
    /// `(whole writes kept, bytes kept of the next one)` for a file with
    /// `len` unsynced writes.
    fn split(self, len: usize) -> (usize, u64) {
        match self {
            Tear::Drop => (0, 0),
            Tear::Keep(n) => (n.min(len), 0),
            Tear::Torn { kept, sectors } => {
                (kept.min(len), sectors.saturating_mul(TORN_SECTOR_LEN_BYTES))
            }
        }
    }
}

/// What a simulated power loss undid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerLoss {
    /// Files that had unsynced writes.
    pub files: u64,
    /// Unsynced writes undone, wholly or in part.
    pub undone: u64,
    /// Unsynced writes kept whole.
    pub kept: u64,
    /// `-shm` files removed (SQLite rebuilds them from the WAL).
    pub shm_removed: u64,
}

/// The calls the fault layer makes on the real file it wraps. Each returns
/// a SQLite result code.
pub(crate) trait RawFile {
    /// The file's size in bytes.
    fn size(&mut self) -> Result<u64, c_int>;
    /// Fills `buf` from `offset`; the range lies within the file.
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> c_int;
    /// Writes `data` at `offset`.
    fn write_at(&mut self, data: &[u8], offset: u64) -> c_int;
    /// Sets the file's size.
    fn truncate(&mut self, size: u64) -> c_int;
    /// Flushes the file with SQLite's `flags`.
    fn sync(&mut self, flags: c_int) -> c_int;
}

/// How to put back one change made since a file's last sync.
#[derive(Debug)]
enum Undo {
    /// A write of `len` bytes at `offset` over `old` (the bytes it replaced
    /// that lay within the file), to a file of `size_before` bytes.
    Write {
        offset: u64,
        len: u64,
        old: Vec<u8>,
        size_before: u64,
    },
    /// A truncation to `size` of a file of `size_before` bytes whose bytes
    /// from `size` on were `tail`.
    Truncate {
        size: u64,
        size_before: u64,
        tail: Vec<u8>,
    },
}

impl Undo {
    /// Puts the file back as it was before this change, except for the first
    /// `kept_bytes` of a write.
    fn revert(&self, file: &std::fs::File, kept_bytes: u64) -> io::Result<()> {
        match self {
            Undo::Write {
                offset,
                len,
                old,
                size_before,
            } => {
                let kept = kept_bytes.min(*len);
                let kept_old = usize::try_from(kept).unwrap_or(usize::MAX).min(old.len());
                file.write_all_at(&old[kept_old..], offset + kept_old as u64)?;
                let size = if kept == 0 {
                    *size_before
                } else {
                    (*size_before).max(offset + kept)
                };
                file.set_len(size)
            }
            Undo::Truncate {
                size,
                size_before,
                tail,
            } => {
                file.set_len(*size_before)?;
                file.write_all_at(tail, *size)
            }
        }
    }
}

/// An armed directory: its fault, its counts and the journals of its files.
#[derive(Debug)]
pub(crate) struct Plan {
    prefix: PathBuf,
    state: Mutex<PlanState>,
}

#[derive(Debug)]
struct PlanState {
    fault: Fault,
    counts: Counts,
    /// The power is cut (see [`Fault::PowerCut`]).
    dead: bool,
    /// Files opened through the VFS and not yet closed.
    files_open: u64,
    /// Per file, every change since its last successful sync, oldest first.
    journals: BTreeMap<PathBuf, Vec<Undo>>,
}

impl PlanState {
    /// `code`, the fault a call meets if any, counted as injected.
    fn inject(&mut self, code: Option<c_int>) -> Option<c_int> {
        if code.is_some() {
            self.counts.injected += 1;
        }
        code
    }

    /// Drops the journal of the file at `path` if the call that made its
    /// changes durable (a sync, a deletion) succeeded; returns its `rc`.
    fn durable(&mut self, path: &Path, rc: c_int) -> c_int {
        if rc == ffi::SQLITE_OK {
            self.journals.remove(path);
        }
        rc
    }

    /// Makes a change to the file at `path` (`change`: a write or a
    /// truncation) unless the fault met (`code`) says otherwise, journaling
    /// the undo that `undo` reads from the file and its size before.
    fn journaled(
        &mut self,
        path: &Path,
        file: &mut dyn RawFile,
        code: Option<c_int>,
        undo: impl FnOnce(&mut dyn RawFile, u64) -> Result<Undo, c_int>,
        change: impl FnOnce(&mut dyn RawFile) -> c_int,
    ) -> c_int {
        if let Some(code) = self.inject(code) {
            return code;
        }
        let undo = match file.size().and_then(|size_before| undo(file, size_before)) {
            Ok(undo) => undo,
            Err(rc) => return rc,
        };
        let rc = change(file);
        if rc == ffi::SQLITE_OK {
            self.journals.entry(path.to_owned()).or_default().push(undo);
        }
        rc
    }
}

/// The `len` bytes of `file` at `offset`, read before a change replaces them.
fn read_span(file: &mut dyn RawFile, offset: u64, len: u64) -> Result<Vec<u8>, c_int> {
    let mut span = vec![0u8; usize::try_from(len).unwrap_or(0)];
    if !span.is_empty() {
        let rc = file.read_at(&mut span, offset);
        if rc != ffi::SQLITE_OK {
            return Err(rc);
        }
    }
    Ok(span)
}

/// Every armed plan of the process.
static PLANS: Mutex<Vec<Arc<Plan>>> = Mutex::new(Vec::new());

fn plans() -> MutexGuard<'static, Vec<Arc<Plan>>> {
    PLANS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The plan armed for a directory holding `path`, if any.
pub(crate) fn lookup(path: &Path) -> Option<Arc<Plan>> {
    plans()
        .iter()
        .find(|plan| path.starts_with(&plan.prefix))
        .cloned()
}

/// A write fails with this code when the power is cut.
const DEAD_WRITE: c_int = ffi::SQLITE_IOERR_WRITE;

impl Plan {
    fn state(&self) -> MutexGuard<'_, PlanState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A file under the prefix was opened.
    pub(crate) fn opened(&self) {
        self.state().files_open += 1;
    }

    /// A file under the prefix was closed.
    pub(crate) fn closed(&self) {
        let mut state = self.state();
        debug_assert!(state.files_open > 0, "a close without an open");
        state.files_open = state.files_open.saturating_sub(1);
    }

    /// Writes `data` at `offset` unless the fault says otherwise, journaling
    /// what it replaces.
    pub(crate) fn write(
        &self,
        path: &Path,
        file: &mut dyn RawFile,
        data: &[u8],
        offset: u64,
    ) -> c_int {
        let mut state = self.state();
        state.counts.writes += 1;
        let nth = state.counts.writes;
        let code = match state.fault {
            _ if state.dead => Some(DEAD_WRITE),
            Fault::FailWrite { nth: n, code } if n == nth => Some(code),
            Fault::ReadOnly => Some(ffi::SQLITE_READONLY),
            _ => None,
        };
        let len = data.len() as u64;
        state.journaled(
            path,
            file,
            code,
            |file, size_before| {
                let overlap = size_before.min(offset + len).saturating_sub(offset);
                Ok(Undo::Write {
                    offset,
                    len,
                    old: read_span(file, offset, overlap)?,
                    size_before,
                })
            },
            |file| file.write_at(data, offset),
        )
    }

    /// Truncates to `size` unless the fault says otherwise, journaling the
    /// tail it removes.
    pub(crate) fn truncate(&self, path: &Path, file: &mut dyn RawFile, size: u64) -> c_int {
        let mut state = self.state();
        state.counts.truncations += 1;
        let code = match state.fault {
            _ if state.dead => Some(ffi::SQLITE_IOERR_TRUNCATE),
            Fault::ReadOnly => Some(ffi::SQLITE_READONLY),
            _ => None,
        };
        state.journaled(
            path,
            file,
            code,
            |file, size_before| {
                Ok(Undo::Truncate {
                    size,
                    size_before,
                    tail: read_span(file, size, size_before.saturating_sub(size))?,
                })
            },
            |file| file.truncate(size),
        )
    }

    /// Syncs unless the fault says otherwise; a successful sync makes every
    /// change of the file so far durable.
    pub(crate) fn sync(&self, path: &Path, file: &mut dyn RawFile, flags: c_int) -> c_int {
        let mut state = self.state();
        state.counts.syncs += 1;
        let nth = state.counts.syncs;
        let code = match state.fault {
            _ if state.dead => Some(ffi::SQLITE_IOERR_FSYNC),
            Fault::FailSync { nth: n, code } if n == nth => Some(code),
            Fault::PowerCut { nth: n } if n == nth => {
                state.dead = true;
                Some(ffi::SQLITE_IOERR_FSYNC)
            }
            _ => None,
        };
        if let Some(code) = state.inject(code) {
            return code;
        }
        let rc = file.sync(flags);
        state.durable(path, rc)
    }

    /// Deletes a file through `delete` unless the power is cut. A deletion
    /// is taken as durable at once: the file's journal is dropped.
    pub(crate) fn delete(&self, path: &Path, delete: impl FnOnce() -> c_int) -> c_int {
        let mut state = self.state();
        state.counts.deletions += 1;
        let code = state.dead.then_some(ffi::SQLITE_IOERR_DELETE);
        if let Some(code) = state.inject(code) {
            return code;
        }
        let rc = delete();
        state.durable(path, rc)
    }
}

/// The faults armed on one directory; disarmed when dropped.
///
/// Only files opened after arming are seen (SQLite opens a file's `-wal`
/// when it first needs it), and whatever the files held when they were
/// first written after arming counts as synced.
#[derive(Debug)]
pub struct FaultPlan {
    plan: Arc<Plan>,
}

impl FaultPlan {
    /// Installs the fault layer (see [`crate::install`]) and arms `dir`
    /// with [`Fault::None`]: every file under it is counted and journaled.
    ///
    /// Panics if the layer cannot be installed, if `dir` does not exist, or
    /// if it lies inside or around a directory already armed.
    pub fn arm(dir: impl AsRef<Path>) -> FaultPlan {
        crate::install().expect("install the fault-injecting VFS");
        let prefix = dir
            .as_ref()
            .canonicalize()
            .expect("an armed directory exists");
        let mut plans = plans();
        assert!(
            plans
                .iter()
                .all(|p| !p.prefix.starts_with(&prefix) && !prefix.starts_with(&p.prefix)),
            "{} overlaps a directory already armed",
            prefix.display()
        );
        let plan = Arc::new(Plan {
            prefix,
            state: Mutex::new(PlanState {
                fault: Fault::None,
                counts: Counts::default(),
                dead: false,
                files_open: 0,
                journals: BTreeMap::new(),
            }),
        });
        plans.push(plan.clone());
        FaultPlan { plan }
    }

    /// The armed directory, as the VFS sees its paths.
    pub fn dir(&self) -> &Path {
        &self.plan.prefix
    }

    /// Replaces the fault and starts the counts again from zero. Setting a
    /// fault does not bring back the power: only a simulated power loss does.
    pub fn set(&self, fault: Fault) {
        let mut state = self.plan.state();
        state.fault = fault;
        state.counts = Counts::default();
    }

    /// What the files saw since the fault was set.
    pub fn counts(&self) -> Counts {
        self.plan.state().counts
    }

    /// Files under the directory opened and not yet closed.
    pub fn files_open(&self) -> u64 {
        self.plan.state().files_open
    }

    /// Writes not yet made durable by a sync, over all files.
    pub fn unsynced_writes(&self) -> usize {
        self.plan.state().journals.values().map(Vec::len).sum()
    }

    /// Puts every file under the directory back as it was at its last
    /// successful sync, except for the unsynced writes `tear` keeps, removes
    /// every `-shm` file (shared memory does not survive a power loss), and
    /// turns the power back on with [`Fault::None`].
    ///
    /// Every connection to the files must be closed first: a connection
    /// would keep pages and locks of the files as they were. Panics if one
    /// is open.
    pub fn simulate_power_loss(&self, tear: Tear) -> io::Result<PowerLoss> {
        let mut state = self.plan.state();
        assert_eq!(
            state.files_open,
            0,
            "close every connection to {} before a power loss",
            self.plan.prefix.display()
        );
        let mut loss = PowerLoss::default();
        for (path, undos) in std::mem::take(&mut state.journals) {
            let (kept, kept_bytes) = tear.split(undos.len());
            restore(&path, &undos, kept, kept_bytes)?;
            loss.files += 1;
            loss.kept += kept as u64;
            loss.undone += (undos.len() - kept) as u64;
        }
        loss.shm_removed = remove_shm(&self.plan.prefix)?;
        state.dead = false;
        state.fault = Fault::None;
        Ok(loss)
    }
}

impl Drop for FaultPlan {
    fn drop(&mut self) {
        plans().retain(|p| !Arc::ptr_eq(p, &self.plan));
    }
}

/// Reverts a file's changes from the last down to the `kept`-th, keeping
/// `kept_bytes` of that one.
fn restore(path: &Path, undos: &[Undo], kept: usize, kept_bytes: u64) -> io::Result<()> {
    let file = match OpenOptions::new().write(true).open(path) {
        Ok(file) => file,
        // Deleted since: the deletion stands.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for (i, undo) in undos.iter().enumerate().skip(kept).rev() {
        let bytes = if i == kept { kept_bytes } else { 0 };
        undo.revert(&file, bytes)?;
    }
    Ok(())
}

/// The most entries an armed directory may hold when its power is lost.
const DIR_ENTRIES_MAX: usize = 10_000;

/// Removes the `-shm` files directly in `dir`; returns how many.
fn remove_shm(dir: &Path) -> io::Result<u64> {
    let entries: Vec<_> = std::fs::read_dir(dir)?
        .take(DIR_ENTRIES_MAX + 1)
        .collect::<io::Result<_>>()?;
    assert!(
        entries.len() <= DIR_ENTRIES_MAX,
        "{} holds more than {DIR_ENTRIES_MAX} entries",
        dir.display()
    );
    let mut removed = 0;
    for entry in entries {
        let path = entry.path();
        if path.to_string_lossy().ends_with("-shm") {
            std::fs::remove_file(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real file through `std::fs`, as the plan sees a wrapped file.
    struct StdFile(std::fs::File);

    impl RawFile for StdFile {
        fn size(&mut self) -> Result<u64, c_int> {
            self.0
                .metadata()
                .map(|m| m.len())
                .map_err(|_| ffi::SQLITE_IOERR_FSTAT)
        }

        fn read_at(&mut self, buf: &mut [u8], offset: u64) -> c_int {
            rc(self.0.read_exact_at(buf, offset), ffi::SQLITE_IOERR_READ)
        }

        fn write_at(&mut self, data: &[u8], offset: u64) -> c_int {
            rc(self.0.write_all_at(data, offset), ffi::SQLITE_IOERR_WRITE)
        }

        fn truncate(&mut self, size: u64) -> c_int {
            rc(self.0.set_len(size), ffi::SQLITE_IOERR_TRUNCATE)
        }

        fn sync(&mut self, _flags: c_int) -> c_int {
            rc(self.0.sync_data(), ffi::SQLITE_IOERR_FSYNC)
        }
    }

    /// `SQLITE_OK` for a call that succeeded, else `error`.
    fn rc(result: io::Result<()>, error: c_int) -> c_int {
        result.map_or(error, |()| ffi::SQLITE_OK)
    }

    /// Writes `data` at `offset` through the plan; the write must succeed.
    fn write_ok(plan: &FaultPlan, path: &Path, file: &mut StdFile, data: &[u8], offset: u64) {
        assert_eq!(plan.plan.write(path, file, data, offset), ffi::SQLITE_OK);
    }

    /// A plan on a fresh directory and a file `f` in it holding `synced`,
    /// synced through the plan.
    fn setup(synced: &[u8]) -> (tempfile::TempDir, FaultPlan, PathBuf, StdFile) {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = FaultPlan::arm(dir.path());
        let path = plan.dir().join("f");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("create f");
        let mut file = StdFile(file);
        write_ok(&plan, &path, &mut file, synced, 0);
        assert_eq!(plan.plan.sync(&path, &mut file, 0), ffi::SQLITE_OK);
        assert_eq!(plan.unsynced_writes(), 0);
        (dir, plan, path, file)
    }

    fn contents(path: &Path) -> Vec<u8> {
        std::fs::read(path).expect("read f")
    }

    #[test]
    fn a_power_loss_undoes_writes_and_truncations_since_the_last_sync() {
        let synced: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8).collect();
        for tear in [
            Tear::Drop,
            Tear::Keep(0),
            Tear::Torn {
                kept: 0,
                sectors: 0,
            },
        ] {
            let (_dir, plan, path, mut file) = setup(&synced);
            assert_eq!(plan.plan.truncate(&path, &mut file, 700), ffi::SQLITE_OK);
            write_ok(&plan, &path, &mut file, &[9; 1500], 600);
            write_ok(&plan, &path, &mut file, &[8; 10], 5000);
            assert_eq!(contents(&path).len(), 5010);
            let loss = plan.simulate_power_loss(tear).expect("power loss");
            assert_eq!((loss.files, loss.undone, loss.kept), (1, 3, 0), "{tear:?}");
            assert_eq!(contents(&path), synced, "{tear:?}");
        }
    }

    #[test]
    fn a_torn_write_keeps_whole_sectors_from_its_start() {
        let synced = vec![1u8; 3000];
        let (_dir, plan, path, mut file) = setup(&synced);
        write_ok(&plan, &path, &mut file, &[2; 100], 0);
        write_ok(&plan, &path, &mut file, &[3; 2000], 2000);
        plan.simulate_power_loss(Tear::Torn {
            kept: 1,
            sectors: 1,
        })
        .expect("power loss");
        let mut expected = vec![1u8; 3000];
        expected[..100].fill(2);
        expected[2000..2512].fill(3);
        assert_eq!(contents(&path), expected);
    }

    #[test]
    fn a_synced_write_survives_and_a_failed_sync_keeps_nothing() {
        let (_dir, plan, path, mut file) = setup(b"synced");
        plan.set(Fault::FailSync {
            nth: 1,
            code: ffi::SQLITE_IOERR_FSYNC,
        });
        write_ok(&plan, &path, &mut file, b"lost", 0);
        assert_eq!(plan.plan.sync(&path, &mut file, 0), ffi::SQLITE_IOERR_FSYNC);
        assert_eq!(plan.unsynced_writes(), 1);
        plan.simulate_power_loss(Tear::Drop).expect("power loss");
        assert_eq!(contents(&path), b"synced");
        write_ok(&plan, &path, &mut file, b"kept", 0);
        assert_eq!(plan.plan.sync(&path, &mut file, 0), ffi::SQLITE_OK);
        plan.simulate_power_loss(Tear::Drop).expect("power loss");
        assert_eq!(contents(&path), b"kepted");
    }

    #[test]
    fn a_deletion_stands_and_is_refused_without_power() {
        let (_dir, plan, path, mut file) = setup(b"synced");
        write_ok(&plan, &path, &mut file, b"x", 0);
        plan.set(Fault::PowerCut { nth: 1 });
        assert_eq!(plan.plan.sync(&path, &mut file, 0), ffi::SQLITE_IOERR_FSYNC);
        let remove = || rc(std::fs::remove_file(&path), ffi::SQLITE_IOERR_DELETE);
        assert_eq!(plan.plan.delete(&path, remove), ffi::SQLITE_IOERR_DELETE);
        assert!(path.exists(), "nothing is deleted without power");
        plan.simulate_power_loss(Tear::Drop).expect("power loss");
        assert_eq!(contents(&path), b"synced");
        assert_eq!(plan.plan.delete(&path, remove), ffi::SQLITE_OK);
        plan.simulate_power_loss(Tear::Drop).expect("power loss");
        assert!(!path.exists(), "a deletion is durable");
    }
}
