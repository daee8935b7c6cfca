//! The SQLite VFS: a wrapper around the default VFS (`unix`) registered as
//! the new default, so that every connection the process opens afterwards
//! goes through it. A file whose path lies under an armed directory is
//! handed to its [`Plan`](crate::plan) on every write, truncation, sync and
//! deletion; every other call, and every call on any other file, goes
//! straight to the wrapped VFS.

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::mem::size_of;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr;
use std::sync::{Arc, OnceLock};

use rusqlite::ffi;

use crate::plan::{self, Plan, RawFile};

/// The name the VFS is registered under.
pub const VFS_NAME: &CStr = c"ordo-faults";

/// What SQLite allocates for each file opened through this VFS (`szOsFile`
/// bytes): this header, then the wrapped VFS's own file structure.
#[repr(C)]
struct FaultFile {
    /// Must come first: SQLite sees a `sqlite3_file`.
    base: ffi::sqlite3_file,
    /// The plan and path of a file under an armed directory.
    tracked: Option<Tracked>,
}

struct Tracked {
    plan: Arc<Plan>,
    path: PathBuf,
}

/// Why the VFS could not be installed: a SQLite result code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstallError(pub c_int);

impl std::fmt::Display for InstallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot register the fault-injecting VFS (SQLite code {})",
            self.0
        )
    }
}

impl std::error::Error for InstallError {}

static INSTALLED: OnceLock<Result<(), InstallError>> = OnceLock::new();

/// Registers the fault-injecting VFS as the process's default VFS, once.
/// Connections opened before keep the VFS they were opened with. Until a
/// directory is armed the VFS only passes calls through.
pub fn install() -> Result<(), InstallError> {
    *INSTALLED.get_or_init(register)
}

fn register() -> Result<(), InstallError> {
    // SAFETY: with a null name SQLite returns its default VFS (initialising
    // the library first), a structure it keeps for the life of the process,
    // or null.
    let base = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
    if base.is_null() {
        return Err(InstallError(ffi::SQLITE_ERROR));
    }
    // SAFETY: `base` is a valid VFS (checked non-null above); it is only read.
    let mut vfs: ffi::sqlite3_vfs = unsafe { ptr::read(base) };
    let header = size_of::<FaultFile>();
    assert_eq!(header % 8, 0, "the wrapped file stays 8-byte aligned");
    vfs.szOsFile += c_int::try_from(header).expect("a small header");
    vfs.pNext = ptr::null_mut();
    vfs.zName = VFS_NAME.as_ptr();
    vfs.pAppData = base.cast();
    vfs.xOpen = Some(x_open);
    vfs.xDelete = Some(x_delete);
    let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
    // SAFETY: `vfs` is leaked, so it outlives every connection that uses it;
    // its other methods are the wrapped VFS's, which do not depend on the
    // fields changed above.
    let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 1) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(InstallError(rc))
    }
}

/// The path SQLite names a file by, if it has one (temporary files do not).
///
/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn path_of(name: *const c_char) -> Option<PathBuf> {
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    Some(PathBuf::from(OsStr::from_bytes(bytes)))
}

/// The wrapped file, which follows the header in SQLite's allocation.
///
/// # Safety
/// `file` is an allocation of this VFS's `szOsFile` bytes.
unsafe fn inner(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the allocation holds the header and then the wrapped file.
    unsafe { file.cast::<u8>().add(size_of::<FaultFile>()).cast() }
}

/// The methods of an open wrapped file.
///
/// # Safety
/// `inner` was opened successfully by the wrapped VFS and not yet closed.
unsafe fn methods<'a>(inner: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: an open file's `pMethods` points at its VFS's static methods.
    unsafe { &*(*inner).pMethods }
}

/// The plan and path of a file opened by [`x_open`], if it is tracked.
///
/// # Safety
/// `file` was opened by [`x_open`] and not yet closed.
unsafe fn tracked<'a>(file: *mut ffi::sqlite3_file) -> Option<&'a Tracked> {
    // SAFETY: `x_open` initialised the header before SQLite could call in.
    unsafe { (*file.cast::<FaultFile>()).tracked.as_ref() }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite passes this VFS, whose `pAppData` is the wrapped VFS,
    // a file allocation of `szOsFile` bytes (8-byte aligned, uninitialised)
    // and a name that is null or NUL-terminated.
    unsafe {
        let base = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
        let header = file.cast::<FaultFile>();
        ptr::write(
            header,
            FaultFile {
                base: ffi::sqlite3_file {
                    pMethods: ptr::null(),
                },
                tracked: None,
            },
        );
        let Some(open) = (*base).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = open(base, name, inner(file), flags, out_flags);
        if rc != ffi::SQLITE_OK {
            // `pMethods` stays null, so SQLite will not call `xClose`.
            return rc;
        }
        let tracked =
            path_of(name).and_then(|path| plan::lookup(&path).map(|plan| Tracked { plan, path }));
        if let Some(t) = &tracked {
            t.plan.opened();
        }
        (*header).tracked = tracked;
        (*header).base.pMethods = &IO_METHODS;
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY: SQLite passes this VFS, whose `pAppData` is the wrapped VFS,
    // and a NUL-terminated name.
    unsafe {
        let base = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
        let delete = || match (*base).xDelete {
            Some(delete) => delete(base, name, sync_dir),
            None => ffi::SQLITE_IOERR_DELETE,
        };
        match path_of(name).and_then(|path| plan::lookup(&path).map(|plan| (plan, path))) {
            Some((plan, path)) => plan.delete(&path, delete),
            None => delete(),
        }
    }
}

/// An open wrapped file, as the plan sees it.
struct Inner(*mut ffi::sqlite3_file);

impl RawFile for Inner {
    fn size(&mut self) -> Result<u64, c_int> {
        let mut size: ffi::sqlite3_int64 = 0;
        // SAFETY: `self.0` is an open wrapped file (see `Inner`'s uses).
        let rc = unsafe {
            match methods(self.0).xFileSize {
                Some(f) => f(self.0, &mut size),
                None => ffi::SQLITE_IOERR_FSTAT,
            }
        };
        if rc == ffi::SQLITE_OK {
            Ok(u64::try_from(size).unwrap_or(0))
        } else {
            Err(rc)
        }
    }

    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> c_int {
        let (Ok(len), Ok(offset)) = (c_int::try_from(buf.len()), i64::try_from(offset)) else {
            return ffi::SQLITE_IOERR_READ;
        };
        // SAFETY: `self.0` is an open wrapped file; `buf` is valid for `len`
        // bytes.
        unsafe {
            match methods(self.0).xRead {
                Some(f) => f(self.0, buf.as_mut_ptr().cast(), len, offset),
                None => ffi::SQLITE_IOERR_READ,
            }
        }
    }

    fn write_at(&mut self, data: &[u8], offset: u64) -> c_int {
        let (Ok(len), Ok(offset)) = (c_int::try_from(data.len()), i64::try_from(offset)) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        // SAFETY: `self.0` is an open wrapped file; `data` is valid for
        // `len` bytes.
        unsafe {
            match methods(self.0).xWrite {
                Some(f) => f(self.0, data.as_ptr().cast(), len, offset),
                None => ffi::SQLITE_IOERR_WRITE,
            }
        }
    }

    fn truncate(&mut self, size: u64) -> c_int {
        let Ok(size) = i64::try_from(size) else {
            return ffi::SQLITE_IOERR_TRUNCATE;
        };
        // SAFETY: `self.0` is an open wrapped file.
        unsafe {
            match methods(self.0).xTruncate {
                Some(f) => f(self.0, size),
                None => ffi::SQLITE_IOERR_TRUNCATE,
            }
        }
    }

    fn sync(&mut self, flags: c_int) -> c_int {
        // SAFETY: `self.0` is an open wrapped file.
        unsafe {
            match methods(self.0).xSync {
                Some(f) => f(self.0, flags),
                None => ffi::SQLITE_IOERR_FSYNC,
            }
        }
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file opened by `x_open` exactly once; the
    // header is initialised and the wrapped file open.
    unsafe {
        let wrapped = inner(file);
        let rc = match methods(wrapped).xClose {
            Some(f) => f(wrapped),
            None => ffi::SQLITE_OK,
        };
        if let Some(t) = (*file.cast::<FaultFile>()).tracked.take() {
            t.plan.closed();
        }
        rc
    }
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite writes to a file opened by `x_open` from a buffer of
    // `amt` (> 0) bytes at a non-negative offset.
    unsafe {
        let mut raw = Inner(inner(file));
        let data = std::slice::from_raw_parts(buf.cast::<u8>(), usize::try_from(amt).unwrap_or(0));
        let offset = u64::try_from(offset).unwrap_or(0);
        match tracked(file) {
            Some(t) => t.plan.write(&t.path, &mut raw, data, offset),
            None => raw.write_at(data, offset),
        }
    }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    // SAFETY: SQLite truncates a file opened by `x_open`.
    unsafe {
        let mut raw = Inner(inner(file));
        let size = u64::try_from(size).unwrap_or(0);
        match tracked(file) {
            Some(t) => t.plan.truncate(&t.path, &mut raw, size),
            None => raw.truncate(size),
        }
    }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: SQLite syncs a file opened by `x_open`.
    unsafe {
        let mut raw = Inner(inner(file));
        match tracked(file) {
            Some(t) => t.plan.sync(&t.path, &mut raw, flags),
            None => raw.sync(flags),
        }
    }
}

/// Defines an io method that passes its call to the wrapped file, or
/// returns `$missing` if the wrapped file lacks the method.
macro_rules! pass_through {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            // SAFETY: SQLite calls io methods only on a file `x_open`
            // opened, whose wrapped file is open; the arguments are SQLite's
            // own, passed on unchanged.
            unsafe {
                let wrapped = inner(file);
                match methods(wrapped).$method {
                    Some(f) => f(wrapped, $($arg),*),
                    None => $missing,
                }
            }
        }
    };
}

pass_through!(x_read, xRead, (buf: *mut c_void, amt: c_int, offset: ffi::sqlite3_int64), ffi::SQLITE_IOERR_READ);
pass_through!(x_file_size, xFileSize, (size: *mut ffi::sqlite3_int64), ffi::SQLITE_IOERR_FSTAT);
pass_through!(x_lock, xLock, (level: c_int), ffi::SQLITE_IOERR_LOCK);
pass_through!(x_unlock, xUnlock, (level: c_int), ffi::SQLITE_IOERR_UNLOCK);
pass_through!(x_check_reserved_lock, xCheckReservedLock, (out: *mut c_int), ffi::SQLITE_IOERR_CHECKRESERVEDLOCK);
pass_through!(x_file_control, xFileControl, (op: c_int, arg: *mut c_void), ffi::SQLITE_NOTFOUND);
pass_through!(x_sector_size, xSectorSize, (), 4096);
pass_through!(x_device_characteristics, xDeviceCharacteristics, (), 0);
pass_through!(x_shm_map, xShmMap, (region: c_int, size: c_int, extend: c_int, out: *mut *mut c_void), ffi::SQLITE_IOERR_SHMMAP);
pass_through!(x_shm_lock, xShmLock, (offset: c_int, n: c_int, flags: c_int), ffi::SQLITE_IOERR_SHMLOCK);
pass_through!(x_shm_unmap, xShmUnmap, (delete: c_int), ffi::SQLITE_OK);
pass_through!(x_fetch, xFetch, (offset: ffi::sqlite3_int64, amt: c_int, out: *mut *mut c_void), ffi::SQLITE_OK);
pass_through!(x_unfetch, xUnfetch, (offset: ffi::sqlite3_int64, page: *mut c_void), ffi::SQLITE_OK);

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: as for `pass_through!`.
    unsafe {
        let wrapped = inner(file);
        if let Some(f) = methods(wrapped).xShmBarrier {
            f(wrapped);
        }
    }
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};
