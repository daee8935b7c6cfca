//! S_sqlite alone, without the `ordo bench` harness around it: a small
//! program to put under a profiler, for the instructions per event that
//! the protocol's rows cost on SQLite (the floor ordo is judged against).
//!
//! ```text
//! cargo build --release -p ordo-lab --example skeleton_sqlite
//! target/release/examples/skeleton_sqlite 10000 256
//! valgrind --tool=callgrind target/release/examples/skeleton_sqlite 3000 256
//! callgrind_annotate --inclusive=yes callgrind.out.<pid> | grep -E 'producer_loop|consumer_loop'
//! ```
//!
//! Arguments: flows (each three events) and the batch size.

use ordo_lab::{skeleton_sqlite, Silent};

fn argument(position: usize, name: &str, default: u64) -> u64 {
    match std::env::args().nth(position) {
        None => default,
        Some(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {text:?} is not a number")),
    }
}

fn main() {
    let flows = argument(1, "flows", 10_000);
    let batch = argument(2, "batch", 256);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let run = skeleton_sqlite::measure(dir.path(), flows, batch, &Silent)
        .unwrap_or_else(|e| panic!("S_sqlite: {e}"));
    println!(
        "S_sqlite: {} events in {:.3} s = {:.0} events/s, B = {batch}, {:.3} commits and {:.3} \
         fsyncs per event",
        run.events,
        run.seconds,
        run.events_per_s(),
        run.commits_per_event(),
        run.fsyncs_per_event()
    );
}
