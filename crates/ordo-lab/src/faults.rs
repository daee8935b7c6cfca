//! Faults for the soak: a worker started with [`FAULT_ENV`] set installs
//! the fault-injecting VFS of `ordo-faults` in its own process and arms the
//! soak's directory, so that its store calls meet an I/O error, a full disk
//! or a failed sync at a random write or sync, as a real disk's would.
//!
//! The value is `KIND:NTH:DIR`, with KIND one of `write-ioerr`,
//! `write-full`, `sync-ioerr`.

use std::path::Path;

use ordo_faults::{Fault, FaultPlan};
use rusqlite::ffi;

use crate::LabError;

/// The environment variable that arms a fault in a worker process.
pub const FAULT_ENV: &str = "ORDO_SOAK_FAULT";

/// The latest write or sync a drawn fault may hit; most workers write far
/// more, so most armed faults are met.
const FAULT_CALL_MAX: u64 = 400;

/// The kinds of fault a worker may be given.
const KINDS: [&str; 3] = ["write-ioerr", "write-full", "sync-ioerr"];

/// A random fault for a worker whose files are in `dir`, as the value of
/// [`FAULT_ENV`].
pub fn draw(rng: &mut fastrand::Rng, dir: &Path) -> String {
    let kind = KINDS[rng.usize(..KINDS.len())];
    let nth = rng.u64(1..=FAULT_CALL_MAX);
    format!("{kind}:{nth}:{}", dir.display())
}

/// Arms the fault [`FAULT_ENV`] names, if set; the plan stays armed while
/// the returned value lives (the process's whole run).
pub fn arm_from_env() -> Result<Option<FaultPlan>, LabError> {
    let Some(value) = std::env::var_os(FAULT_ENV) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .ok_or_else(|| LabError::Usage(format!("{FAULT_ENV} is not UTF-8")))?;
    let (fault, dir) = parse(value)?;
    let plan = FaultPlan::arm(dir);
    plan.set(fault);
    Ok(Some(plan))
}

fn parse(value: &str) -> Result<(Fault, &Path), LabError> {
    let bad = || LabError::Usage(format!("{FAULT_ENV}={value:?}: expected KIND:NTH:DIR"));
    let mut parts = value.splitn(3, ':');
    let (kind, nth, dir) = (
        parts.next().ok_or_else(bad)?,
        parts.next().ok_or_else(bad)?,
        parts.next().ok_or_else(bad)?,
    );
    let nth: u64 = nth.parse().map_err(|_| bad())?;
    let fault = match kind {
        "write-ioerr" => Fault::FailWrite {
            nth,
            code: ffi::SQLITE_IOERR_WRITE,
        },
        "write-full" => Fault::FailWrite {
            nth,
            code: ffi::SQLITE_FULL,
        },
        "sync-ioerr" => Fault::FailSync {
            nth,
            code: ffi::SQLITE_IOERR_FSYNC,
        },
        _ => return Err(bad()),
    };
    Ok((fault, Path::new(dir)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drawn_faults_parse_back() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..50 {
            let value = draw(&mut rng, Path::new("/tmp/soak"));
            let (fault, dir) = parse(&value).unwrap();
            assert_eq!(dir, Path::new("/tmp/soak"));
            assert!(!matches!(fault, Fault::None), "{value}");
        }
        for bad in ["", "write-ioerr", "write-ioerr:x:/d", "melt:3:/d"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
