//! Named crash points: a process-level setting that makes the process exit
//! with status [`CRASH_EXIT_STATUS`] exactly at one named point in the paths
//! production uses.
//!
//! Arm a point by setting the environment variable [`CRASH_POINT_ENV`] to its
//! name before the process starts. Unarmed, a point costs one load of a
//! once-initialised value.

use std::sync::OnceLock;

/// The environment variable that arms one crash point for a process.
pub const CRASH_POINT_ENV: &str = "ORDO_CRASH_POINT";
/// The exit status of a process stopped at a crash point.
pub const CRASH_EXIT_STATUS: i32 = 73;

/// Every named crash point, in the order of an event's life.
pub const CRASH_POINTS: [&str; 11] = [
    PRODUCER_ADVANCE_BEFORE_COMMIT,
    PRODUCER_ADVANCE_AFTER_COMMIT,
    RELAY_BEFORE_RECEIVE,
    RELAY_AFTER_RECEIVE,
    RELAY_MARK_BEFORE_COMMIT,
    CONSUMER_RECEIVE_BEFORE_COMMIT,
    CONSUMER_RECEIVE_AFTER_COMMIT,
    SERVE_AFTER_COMMIT,
    CONSUMER_APPLY_AFTER_PROJECTION,
    CONSUMER_APPLY_AFTER_EFFECT,
    CONSUMER_APPLY_AFTER_COMMIT,
];

/// Inside advance, after the writes, before the commit.
pub const PRODUCER_ADVANCE_BEFORE_COMMIT: &str = "producer.advance.before_commit";
/// Right after advance committed.
pub const PRODUCER_ADVANCE_AFTER_COMMIT: &str = "producer.advance.after_commit";
/// In the relay, before handing an event to the consumer.
pub const RELAY_BEFORE_RECEIVE: &str = "relay.before_receive";
/// In the relay, after the receipt, before marking.
pub const RELAY_AFTER_RECEIVE: &str = "relay.after_receive";
/// Inside the mark transaction, before its commit.
pub const RELAY_MARK_BEFORE_COMMIT: &str = "relay.mark.before_commit";
/// Inside receive, after the inserts, before the commit.
pub const CONSUMER_RECEIVE_BEFORE_COMMIT: &str = "consumer.receive.before_commit";
/// In a group commit, after the batch's units ran, before its commit.
pub const PRODUCER_GROUP_BEFORE_COMMIT: &str = "producer.group.before_commit";
/// In a group commit, after the batch committed, before any caller is told.
pub const PRODUCER_GROUP_AFTER_COMMIT: &str = "producer.group.after_commit";
/// The group commit's points, which the seed's experiment does not run (its
/// producer is one `advance` per process); their tests run many producer
/// threads in one process.
pub const GROUP_CRASH_POINTS: [&str; 2] =
    [PRODUCER_GROUP_BEFORE_COMMIT, PRODUCER_GROUP_AFTER_COMMIT];
/// Right after receive committed.
pub const CONSUMER_RECEIVE_AFTER_COMMIT: &str = "consumer.receive.after_commit";
/// In `ordo serve`, after a request's receive transaction committed, before
/// its response is built: the client sees a broken connection.
pub const SERVE_AFTER_COMMIT: &str = "serve.after_commit";
/// Inside apply, after the projection write.
pub const CONSUMER_APPLY_AFTER_PROJECTION: &str = "consumer.apply.after_projection";
/// Inside apply, after the effect insert.
pub const CONSUMER_APPLY_AFTER_EFFECT: &str = "consumer.apply.after_effect";
/// Right after apply committed.
pub const CONSUMER_APPLY_AFTER_COMMIT: &str = "consumer.apply.after_commit";
/// An effect executor's claim committed, before the call (EFFECTS.md).
pub const EFFECT_AFTER_CLAIM: &str = "effect.after_claim";
/// An effect's answer received, before its outcome is recorded.
pub const EFFECT_AFTER_CALL: &str = "effect.after_call";
/// An effect's outcome committed.
pub const EFFECT_AFTER_RECORD: &str = "effect.after_record";
/// The effect executor's points (EFFECTS.md "Crash points").
pub const EFFECT_CRASH_POINTS: [&str; 3] =
    [EFFECT_AFTER_CLAIM, EFFECT_AFTER_CALL, EFFECT_AFTER_RECORD];

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(CRASH_POINT_ENV).ok())
        .as_deref()
}

/// Exits the process with status 73 if `name` is the armed point.
#[inline]
pub fn point(name: &'static str) {
    if armed() == Some(name) {
        std::process::exit(CRASH_EXIT_STATUS);
    }
}
