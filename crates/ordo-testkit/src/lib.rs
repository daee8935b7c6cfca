//! # ordo-testkit
//!
//! The backend conformance suite: the rules of `PROTOCOL.md` (sections 2 to
//! 7), each written once as a function over the store traits of `ordo-core`,
//! and a macro that expands the whole suite into one `#[test]` per rule for a
//! backend.
//!
//! A backend implements [`Backend`] (open its producer and consumer stores in
//! a directory; opening again on the same directory is a fresh process after
//! a crash) and runs the suite from an integration test:
//!
//! ```ignore
//! struct Sqlite;
//!
//! impl ordo_testkit::Backend for Sqlite {
//!     type Producer = ProducerDb;
//!     type Consumer = ConsumerDb;
//!     fn open(dir: &Path) -> (ProducerDb, ConsumerDb) { /* ... */ }
//! }
//!
//! ordo_testkit::conformance_suite!(Sqlite);
//! ```
//!
//! Each expanded test gets its own fresh temporary directory. A backend is
//! done when the suite passes unchanged.

#![warn(missing_docs)]

use std::path::Path;

use ordo_core::{ConsumerStore, ProducerStore};

pub mod suite;
pub mod support;

/// A storage backend under test: how to open its two stores.
pub trait Backend {
    /// The producer side (flows and outbox).
    type Producer: ProducerStore;
    /// The consumer side (inbox, projection, effects).
    type Consumer: ConsumerStore;

    /// Opens (creating what is missing) the producer and consumer stores that
    /// live in `dir`. Calling it again on the same `dir` must see the same
    /// state, as a fresh process would after a crash; it never resets
    /// anything. `dir` is empty and private to one test the first time.
    ///
    /// Panics if the stores cannot be opened.
    fn open(dir: &Path) -> (Self::Producer, Self::Consumer);
}

#[doc(hidden)]
pub mod __private {
    pub use tempfile::{tempdir, TempDir};

    /// Runs one suite function; one listed as an expected failure must fail.
    pub fn run(name: &str, expected_failures: &[(&str, &str)], test: impl FnOnce()) {
        let Some((_, reason)) = expected_failures.iter().find(|(n, _)| *n == name) else {
            test();
            return;
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(test)) {
            Err(_) => eprintln!("{name}: fails as expected (known defect: {reason})"),
            Ok(()) => panic!(
                "{name} is listed as an expected failure ({reason}) but passes: \
                 remove it from expected_failures"
            ),
        }
    }
}

/// Expands the whole conformance suite for a backend: one `#[test]` per
/// suite function, each with its own fresh temporary directory.
///
/// Use it once, at the top level of an integration test file, with a type
/// that implements [`Backend`]:
///
/// ```ignore
/// ordo_testkit::conformance_suite!(MyBackend);
/// ```
///
/// A backend with a known, reported defect may list the suite functions that
/// currently fail, each with the reason:
///
/// ```ignore
/// ordo_testkit::conformance_suite!(MyBackend, expected_failures: {
///     receive_seq_bounds: "bodies lose integer precision above 2^53",
/// });
/// ```
///
/// Such a test passes only while it still fails (the failure is printed);
/// once the defect is fixed it fails, asking for its entry to be removed.
#[macro_export]
macro_rules! conformance_suite {
    ($backend:ty $(,)?) => {
        $crate::conformance_suite!($backend, expected_failures: {});
    };
    ($backend:ty, expected_failures: { $($known:ident : $reason:literal),* $(,)? } $(,)?) => {
        $crate::conformance_suite!(@expand $backend; [$((stringify!($known), $reason)),*];
            // producer
            advance_happy_path
            advance_schema_2_payload
            advance_stale_writes_nothing
            advance_illegal_transitions_write_nothing
            advance_quantity_mismatch_writes_nothing
            advance_quantity_defaults_for_later_steps
            advance_seq_is_contiguous_per_flow
            advance_batch_sees_earlier_requests
            // relay
            relay_marks_accepted_on_accepted_and_duplicate
            relay_never_marks_conflict_accepted
            relay_first_pending_conflict_starves_later_events
            relay_event_on_accepted_event_is_duplicate
            relay_event_unknown_id_errors
            relay_respects_max
            relay_fair_conflict_does_not_starve_other_flows
            // receive
            receive_accepted_then_duplicate
            receive_conflict_same_event_id_changes_nothing
            receive_conflict_same_flow_seq_changes_nothing
            receive_duplicate_ignores_key_order_and_number_spelling
            receive_batch_in_one_call
            receive_never_changes_projection_or_effects
            receive_seq_bounds
            // apply
            apply_in_order_then_idle
            apply_all_six_arrival_orders
            apply_unknown_schema_blocked_body_unchanged
            apply_schema_2_blocked_then_applied_as_stored_with_support_v2
            apply_invalid_payload_blocked
            apply_invalid_transition_blocked
            apply_blocked_row_stays_blocked
            drain_stop_reasons
            process_all_isolation
            apply_batches_keep_order_and_limits
            end_to_end_advance_relay_apply
            // durability
            reopen_keeps_all_state
            apply_exactly_once_across_reopen
            // properties
            prop_any_arrival_order_with_duplicates
            prop_advance_matches_model
        );
        const _: () = {
            // every expected failure names a suite function
            #[allow(unused_imports)]
            use $crate::suite::{$($known),*};
        };
    };
    (@expand $backend:ty; $known:tt; $($name:ident)*) => {
        $(
            #[test]
            fn $name() {
                let dir = $crate::__private::tempdir().expect("cannot create a temporary directory");
                $crate::__private::run(stringify!($name), &$known, || {
                    $crate::suite::$name::<$backend>(dir.path())
                });
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    /// Every suite function is expanded by `conformance_suite!`, and the
    /// macro names nothing else.
    #[test]
    fn macro_lists_every_suite_function() {
        let sources = [
            include_str!("suite/producer.rs"),
            include_str!("suite/relay.rs"),
            include_str!("suite/receive.rs"),
            include_str!("suite/apply.rs"),
            include_str!("suite/durability.rs"),
            include_str!("suite/props.rs"),
        ];
        let mut defined: Vec<&str> = sources
            .iter()
            .flat_map(|s| s.lines())
            .filter_map(|l| l.trim().strip_prefix("pub fn "))
            .filter_map(|l| l.split_once("<B: Backend>").map(|(name, _)| name))
            .collect();
        defined.sort_unstable();
        let lib = include_str!("lib.rs");
        let marker = "[$((stringify!($known), $reason)),*];\n";
        let start = lib.find(marker).expect("macro body") + marker.len();
        let end = start + lib[start..].find(");").expect("end of list");
        let mut listed: Vec<&str> = lib[start..end]
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .collect();
        listed.sort_unstable();
        assert!(defined.len() > 30, "found only {defined:?}");
        assert_eq!(defined, listed);
    }
}
