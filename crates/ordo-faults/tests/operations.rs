//! Every ordo operation under every fault point: an I/O error and a full
//! disk at each write, a failed sync at each sync, a read-only disk, and a
//! power cut at each sync with torn and kept writes. See `docs/faults.md`.
//!
//! Each test prints how many fault points it injected, on a line starting
//! with `fault points:` (run with `--nocapture` to see them).

use ordo_core::ErrorKind;
use ordo_faults::harness::{self, Template};
use ordo_faults::ops::Operation;
use rusqlite::ffi;

fn report(op: Operation, what: &str, points: u64) {
    eprintln!("fault points: {:<16} {what:<22} {points}", op.name());
    assert!(points > 0, "{}: no {what} point was injected", op.name());
}

/// Injects `code` at every write of `op`, each expected to fail as `kind`:
/// one point per write.
fn at_every_write(op: Operation, code: std::ffi::c_int, kind: ErrorKind, what: &str) {
    let template = Template::build(op);
    let points = harness::write_faults(&template, code, kind);
    assert_eq!(points, template.writes(), "one point per write");
    report(op, what, points);
}

macro_rules! fault_tests {
    ($module:ident, $op:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn survives_an_io_error_at_every_write() {
                at_every_write(
                    $op,
                    ffi::SQLITE_IOERR_WRITE,
                    ErrorKind::CommitOutcomeUnknown,
                    "write error (IOERR)",
                );
            }

            #[test]
            fn reports_disk_full_at_every_write_and_recovers() {
                at_every_write(
                    $op,
                    ffi::SQLITE_FULL,
                    ErrorKind::DiskFull,
                    "disk full (FULL)",
                );
            }

            #[test]
            fn survives_a_failed_sync_at_every_sync() {
                let template = Template::build($op);
                let points = harness::sync_faults(&template);
                assert_eq!(points, template.syncs(), "one point per sync");
                report($op, "sync error (FSYNC)", points);
            }

            #[test]
            fn fails_as_read_only_on_a_read_only_disk_and_changes_nothing() {
                let template = Template::build($op);
                let refused = harness::read_only(&template);
                report($op, "read-only refusals", refused);
            }

            #[test]
            fn keeps_every_commit_through_a_power_cut_at_every_sync() {
                let template = Template::build($op);
                let points = harness::power_loss_every_sync(&template);
                assert_eq!(
                    points,
                    (template.syncs() + 1) * harness::TEARS.len() as u64,
                    "every sync and every tear"
                );
                report($op, "power-loss points", points);
            }
        }
    };
}

fault_tests!(producer_advance, Operation::ProducerAdvance);
fault_tests!(relay_round, Operation::RelayRound);
fault_tests!(receive_batch, Operation::ReceiveBatch);
fault_tests!(apply_batch, Operation::ApplyBatch);
fault_tests!(inbox_skip, Operation::InboxSkip);
fault_tests!(inbox_prune, Operation::InboxPrune);
