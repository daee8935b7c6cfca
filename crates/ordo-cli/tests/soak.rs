//! `ordo soak --faults`: SIGKILLs and injected I/O errors, full disks and
//! failed syncs in the workers, with the same verdict as without faults.

mod common;

use common::*;

#[test]
fn soak_with_faults_keeps_every_invariant() {
    let out = run(&[
        "soak",
        "--seconds",
        "6",
        "--flows",
        "60",
        "--seed",
        "11",
        "--faults",
        "--json",
    ]);
    let report = out.json();
    assert_eq!(report["verdict"], "ok", "{report}");
    assert!(report["faults_armed"].as_u64().unwrap() > 0, "{report}");
    assert!(report["kills"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["events"], 180, "{report}");
}
