//! # ordo-testkit
//!
//! The backend conformance suite: the rules of `docs/PROTOCOL.md` (sections 2 to
//! 8), each written once as a function over the store traits of `ordo-core`,
//! and a macro that expands the whole suite into one `#[test]` per rule for a
//! backend.
//!
//! A backend implements [`Backend`] (open its producer and consumer stores in
//! a directory with a given clock; opening again on the same directory is a
//! fresh process after a crash) and runs the suite from an integration test:
//!
//! ```no_run
//! use std::path::Path;
//! use std::sync::Arc;
//!
//! use ordo_core::{BlockCode, Clock};
//! use ordo_sqlite::rusqlite::Connection;
//! use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb, Schema};
//! use ordo_testkit::suite::generic::TestDomain;
//!
//! struct Sqlite;
//!
//! impl ordo_testkit::Backend for Sqlite {
//!     type Producer = ProducerDb;
//!     type Consumer = ConsumerDb;
//!
//!     fn open_with_clock(dir: &Path, clock: Arc<dyn Clock>) -> (ProducerDb, ConsumerDb) {
//!         let options = OpenOptions::default();
//!         let producer_schema = ordo_reservation::producer_schema();
//!         let consumer_schema = ordo_reservation::consumer_schema();
//!         let producer =
//!             ProducerDb::open_with(dir.join("producer.db"), &producer_schema, clock.clone(), &options)
//!                 .expect("open producer.db");
//!         let consumer =
//!             ConsumerDb::open_with(dir.join("consumer.db"), &consumer_schema, clock, &options)
//!                 .expect("open consumer.db");
//!         (producer, consumer)
//!     }
//!
//!     fn open_named_producer(
//!         dir: &Path,
//!         name: Option<ordo_core::ProducerName>,
//!     ) -> Result<ProducerDb, ordo_core::StoreError> {
//!         let options = OpenOptions { producer_name: name, ..OpenOptions::default() };
//!         let schema = Schema::new("named").expect("a domain name");
//!         ProducerDb::open_with(dir.join("named.db"), &schema, Arc::new(ordo_core::SystemClock), &options)
//!     }
//!
//!     // The generic suite's test domain (its contract: `suite::generic`).
//!     type TestHandler = TestDomain<Connection>;
//!
//!     fn open_test_domain(dir: &Path) -> ConsumerDb {
//!         let schema = Schema::new("testkit")
//!             .expect("a domain name")
//!             .migration("CREATE TABLE handled (flow_id TEXT, seq INTEGER, PRIMARY KEY (flow_id, seq))");
//!         ConsumerDb::open(dir.join("test-domain.db"), &schema).expect("open test-domain.db")
//!     }
//!
//!     fn test_handler(reevaluate: Vec<BlockCode>) -> TestDomain<Connection> {
//!         // The contract's record, in this backend's query language.
//!         TestDomain::new(reevaluate, |tx, event| {
//!             tx.execute(
//!                 "INSERT INTO handled VALUES (?1, ?2)",
//!                 (event.flow_id.as_str(), event.seq.get()),
//!             )?;
//!             Ok(())
//!         })
//!     }
//!
//!     fn handled(consumer: &mut ConsumerDb) -> Vec<(String, i64)> {
//!         let mut stmt = consumer
//!             .connection()
//!             .prepare("SELECT flow_id, seq FROM handled ORDER BY flow_id, seq")
//!             .expect("read");
//!         stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
//!             .expect("read")
//!             .collect::<Result<_, _>>()
//!             .expect("read")
//!     }
//! }
//!
//! ordo_testkit::conformance_suite!(Sqlite);
//! # fn main() {}
//! ```
//!
//! Each expanded test gets its own fresh temporary directory. A backend is
//! done when the suite passes unchanged: there is no way to mark a suite
//! function as skipped or expected to fail.

#![warn(missing_docs)]

use std::path::Path;
use std::sync::Arc;

use ordo_core::effect::EffectStore;
use ordo_core::{ApplyHandler, BlockCode, Clock, ConsumerStore, ProducerStore, SystemClock};
use ordo_reservation::{ReservationConsumer, ReservationProducer};

pub mod check;
pub mod deep;
pub mod fuzz;
pub mod guards;
pub mod spans;
pub mod suite;
pub mod support;

/// A storage backend under test: how to open its two stores.
pub trait Backend {
    /// The producer side (outbox, and the reservation domain's flows).
    type Producer: ProducerStore + ReservationProducer;
    /// The consumer side (inbox, and the reservation domain's projection
    /// and effects).
    type Consumer: ReservationConsumer + EffectStore;

    /// Opens (creating what is missing) the producer and consumer stores that
    /// live in `dir`, both reading the time they stamp on their own writes
    /// (an event's creation, a reception, an application, an acceptance
    /// through `mark_accepted`) from `clock`; times passed as arguments
    /// (`now_ms`, `cutoff_ms`) are used as given. Calling it again on the
    /// same `dir` must see the same state, as a fresh process would after a
    /// crash; it never resets anything. `dir` is empty and private to one
    /// test the first time.
    ///
    /// Panics if the stores cannot be opened.
    fn open_with_clock(dir: &Path, clock: Arc<dyn Clock>) -> (Self::Producer, Self::Consumer);

    /// [`Backend::open_with_clock`] with the system clock.
    fn open(dir: &Path) -> (Self::Producer, Self::Consumer) {
        Self::open_with_clock(dir, Arc::new(SystemClock))
    }

    /// The generic suite's handler (see [`suite::generic`]
    /// for its contract), evaluating again the rows blocked with
    /// `reevaluate`.
    type TestHandler: ApplyHandler<<Self::Consumer as ConsumerStore>::Tx>;

    /// A consumer store of the generic suite's test domain in `dir`, with
    /// the test handler's own table.
    fn open_test_domain(dir: &Path) -> Self::Consumer;

    /// Opens (creating it the first time) a producer store of its own in
    /// `dir`, beside the others, of a domain without tables of its own,
    /// created with the producer name `name` (the backend's open options),
    /// or the error of the open.
    fn open_named_producer(
        dir: &Path,
        name: Option<ordo_core::ProducerName>,
    ) -> Result<Self::Producer, ordo_core::StoreError>;

    /// The test handler for these codes to evaluate again.
    fn test_handler(reevaluate: Vec<BlockCode>) -> Self::TestHandler;

    /// What the test handler recorded, as `(flow_id, seq)` ordered by flow
    /// then seq.
    fn handled(consumer: &mut Self::Consumer) -> Vec<(String, i64)>;
}

#[doc(hidden)]
pub mod __private {
    pub use tempfile::{tempdir, TempDir};
}

/// Expands the whole conformance suite for a backend: one `#[test]` per
/// suite function, each with its own fresh temporary directory.
///
/// Use it once, at the top level of an integration test file, with a type
/// that implements [`Backend`] (see the crate documentation for a complete
/// backend):
///
/// ```no_run
/// # use std::path::Path;
/// # use std::sync::Arc;
/// # use ordo_core::Clock;
/// # struct MyBackend;
/// # impl ordo_testkit::Backend for MyBackend {
/// #     type Producer = ordo_sqlite::ProducerDb;
/// #     type Consumer = ordo_sqlite::ConsumerDb;
/// #     fn open_with_clock(dir: &Path, clock: Arc<dyn Clock>) -> (Self::Producer, Self::Consumer) {
/// #         let options = ordo_sqlite::OpenOptions::default();
/// #         let (ps, cs) = (ordo_reservation::producer_schema(), ordo_reservation::consumer_schema());
/// #         let p = ordo_sqlite::ProducerDb::open_with(dir.join("p.db"), &ps, clock.clone(), &options);
/// #         let c = ordo_sqlite::ConsumerDb::open_with(dir.join("c.db"), &cs, clock, &options);
/// #         (p.expect("producer"), c.expect("consumer"))
/// #     }
/// #     type TestHandler = fn(&mut ordo_core::ApplyContext<ordo_sqlite::rusqlite::Connection>, &ordo_core::Envelope)
/// #         -> Result<ordo_core::Verdict, ordo_core::StoreError>;
/// #     fn open_test_domain(dir: &Path) -> Self::Consumer {
/// #         let schema = ordo_sqlite::Schema::new("testkit").expect("a domain");
/// #         ordo_sqlite::ConsumerDb::open(dir.join("t.db"), &schema).expect("consumer")
/// #     }
/// #     fn test_handler(_: Vec<ordo_core::BlockCode>) -> Self::TestHandler {
/// #         |_, _| Ok(ordo_core::Verdict::Apply)
/// #     }
/// #     fn handled(_: &mut Self::Consumer) -> Vec<(String, i64)> {
/// #         Vec::new()
/// #     }
/// #     fn open_named_producer(
/// #         dir: &Path,
/// #         name: Option<ordo_core::ProducerName>,
/// #     ) -> Result<Self::Producer, ordo_core::StoreError> {
/// #         let options = ordo_sqlite::OpenOptions { producer_name: name, ..Default::default() };
/// #         let schema = ordo_sqlite::Schema::new("named").expect("a domain");
/// #         ordo_sqlite::ProducerDb::open_with(dir.join("n.db"), &schema, Arc::new(ordo_core::SystemClock), &options)
/// #     }
/// # }
/// ordo_testkit::conformance_suite!(MyBackend);
/// # fn main() {}
/// ```
///
/// Every expanded test must pass: the suite has no list of known failures.
#[macro_export]
macro_rules! conformance_suite {
    (@expand $backend:ty; $($name:ident)*) => {
        $(
            #[test]
            fn $name() {
                let dir = $crate::__private::tempdir().expect("cannot create a temporary directory");
                $crate::suite::$name::<$backend>(dir.path());
            }
        )*
    };
    ($backend:ty $(,)?) => {
        $crate::conformance_suite!(@expand $backend;
            // any handler
            generic_handler_writes_commit_with_the_mark_and_a_block_undoes_them
            generic_reevaluation_is_the_handlers_choice
            generic_a_block_in_a_batch_undoes_only_its_own_writes
            generic_a_batch_hands_its_events_to_the_handler_at_once
            generic_a_reevaluated_row_keeps_its_place_in_the_batch
            generic_a_batch_drains_a_long_flow_among_short_ones
            // producer
            a_producer_is_named_once_and_its_events_carry_the_name
            headers_are_kept_with_the_event_and_bad_ones_refused
            advance_happy_path
            advance_schema_2_payload
            advance_stale_writes_nothing
            advance_illegal_transitions_write_nothing
            advance_quantity_mismatch_writes_nothing
            advance_quantity_defaults_for_later_steps
            advance_seq_is_contiguous_per_flow
            advance_batch_sees_earlier_requests
            advance_batch_refused_request_writes_nothing_for_itself
            // relay
            relay_marks_accepted_on_accepted_and_duplicate
            relay_never_marks_conflict_accepted
            relay_first_pending_conflict_starves_later_events
            relay_event_on_accepted_event_is_duplicate
            relay_event_unknown_id_errors
            relay_respects_max
            relay_fair_conflict_does_not_starve_other_flows
            traceparents_are_recorded_on_each_events_spans
            // delivery bookkeeping (section 8)
            fair_round_takes_each_flow_head_least_recently_served_first
            relay_fair_serves_flows_round_robin_one_head_each
            relay_fair_conflict_quarantines_only_that_event
            relay_rewound_flow_stops_there_and_others_go_on
            record_receipts_moves_custody_or_quarantines
            receipts_for_events_pruned_meanwhile_are_not_an_error
            record_failure_backs_off_only_that_flow
            record_failure_waits_stay_within_the_backoff_ceiling
            relay_transient_failure_backs_off_the_whole_round
            relay_failure_at_the_end_of_time_saturates
            retry_quarantined_refusals_change_nothing_and_retry_requeues
            prune_outbox_removes_only_old_accepted_rows
            // custody per destination (section 12)
            destinations_keep_their_own_custody_and_prune_waits_for_all
            a_destination_begins_flows_at_their_start_and_refusals_write_nothing
            abandon_retires_a_flow_for_one_destination_only
            a_destination_keeps_to_the_consumer_of_its_first_delivery
            one_destinations_failures_never_delay_another
            // receive
            receive_accepted_then_duplicate
            receive_conflict_same_event_id_changes_nothing
            receive_conflict_same_flow_seq_changes_nothing
            receive_duplicate_ignores_key_order_and_number_spelling
            receive_batch_in_one_call
            receive_nothing_after_a_conflict_in_one_delivery
            receive_tells_a_rewound_producer_from_a_conflict
            receive_an_unknown_store_never_makes_a_rewound_producer
            a_rewound_producer_is_told_by_a_fingerprint_and_its_new_flows_go_on
            receive_and_apply_keep_each_producers_namespace
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
            apply_batch_across_flows_reports_each_stop
            end_to_end_advance_relay_apply
            // operator repairs, status and retention (section 8)
            skip_refusals_write_nothing
            skip_marks_skipped_moves_past_and_logs_the_repair
            reopen_blocked_re_evaluates_with_support_v2
            consumer_status_counts_pending_blocked_and_gaps
            consumer_status_caps_the_listed_gaps
            prune_inbox_keeps_fingerprints_and_never_reapplies
            // external effects (EFFECTS.md)
            effects_commit_with_the_apply_and_never_with_a_block_or_a_refusal
            effects_run_in_order_per_flow_and_retry_after_the_backoff
            effects_an_unknown_outcome_waits_for_an_operator
            effects_a_dedup_window_sends_again_under_the_same_key
            effects_an_expired_lease_is_unknown_unless_reconcile_can_tell
            effects_prune_removes_settled_intents
            // browsing (the operator console)
            browse_producer_flows_by_prefix_and_page
            browse_flow_outbox_entries_in_seq_order
            browse_consumer_flows_and_one_inbox_row
            // durability
            reopen_keeps_all_state
            apply_exactly_once_across_reopen
            // properties
            prop_any_arrival_order_with_duplicates
            prop_advance_matches_model
        );
    };
}

#[cfg(test)]
mod tests {
    /// The suite's source files, by module name.
    const SOURCES: [(&str, &str); 12] = [
        ("apply", include_str!("suite/apply.rs")),
        ("browse", include_str!("suite/browse.rs")),
        ("delivery", include_str!("suite/delivery.rs")),
        ("destinations", include_str!("suite/destinations.rs")),
        ("durability", include_str!("suite/durability.rs")),
        ("effects", include_str!("suite/effects.rs")),
        ("generic", include_str!("suite/generic.rs")),
        ("operations", include_str!("suite/operations.rs")),
        ("producer", include_str!("suite/producer.rs")),
        ("props", include_str!("suite/props.rs")),
        ("receive", include_str!("suite/receive.rs")),
        ("relay", include_str!("suite/relay.rs")),
    ];

    /// Every suite module is read by the check below.
    #[test]
    fn every_suite_module_is_checked() {
        let mut declared: Vec<&str> = include_str!("suite/mod.rs")
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                l.strip_prefix("mod ")
                    .or_else(|| l.strip_prefix("pub mod "))
            })
            .filter_map(|l| l.strip_suffix(';'))
            .collect();
        declared.sort_unstable();
        let checked: Vec<&str> = SOURCES.iter().map(|(name, _)| *name).collect();
        assert_eq!(declared, checked);
    }

    /// The name of the suite function a source line declares: a public
    /// function generic over a backend, whatever its parameter is called.
    fn suite_function_name(line: &str) -> Option<&str> {
        let rest = line.trim().strip_prefix("pub fn ")?;
        let (name, generics) = rest.split_once('<')?;
        let generics = generics.split_once(">(")?.0;
        generics.contains("Backend").then_some(name)
    }

    #[test]
    fn suite_functions_are_found_whatever_their_generic_parameter_is_called() {
        let cases = [
            ("pub fn a<B: Backend>(dir: &Path) {", Some("a")),
            ("    pub fn b<S: Backend>(dir: &Path) {", Some("b")),
            ("pub fn c<Store: Backend + Send>(dir: &Path) {", Some("c")),
            ("pub fn helper(dir: &Path) {", None),
            ("pub fn generic<T: Clone>(t: T) {", None),
            ("fn private<B: Backend>(dir: &Path) {", None),
        ];
        for (line, expected) in cases {
            assert_eq!(suite_function_name(line), expected, "{line}");
        }
    }

    /// Every suite function is expanded by `conformance_suite!`, and the
    /// macro names nothing else.
    #[test]
    fn macro_lists_every_suite_function() {
        let mut defined: Vec<&str> = SOURCES
            .iter()
            .flat_map(|(_, s)| s.lines())
            .filter_map(suite_function_name)
            .collect();
        defined.sort_unstable();
        let lib = include_str!("lib.rs");
        let marker = "$crate::conformance_suite!(@expand $backend;\n";
        assert_eq!(
            lib.matches(marker).count(),
            1,
            "one list of suite functions"
        );
        let start = lib.find(marker).expect("macro body") + marker.len();
        let end = start + lib[start..].find(");").expect("end of list");
        let mut listed: Vec<&str> = lib[start..end]
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .collect();
        listed.sort_unstable();
        assert!(defined.len() > 50, "found only {defined:?}");
        let mut unique = listed.clone();
        unique.dedup();
        assert_eq!(unique, listed, "a suite function is listed twice");
        assert_eq!(defined, listed);
    }
}
