//! What the runtime's loops need of a store beyond its role's trait: the
//! store's clock, its in-process wake-up signal, a cheap look for commits
//! of other processes, and (for an observed apply loop) when an event was
//! received.
//!
//! Invariant: these traits only describe; a backend answers them from its
//! own handle, and the runtime (`ordo-runtime`) knows no backend.

use std::sync::Arc;

use crate::clock::Clock;
use crate::envelope::Envelope;
use crate::error::StoreError;
use crate::store::ConsumerStore;
use crate::wake::Signal;

/// A store handle that a loop of the runtime can run on.
pub trait RunStore {
    /// The clock the store reads time from.
    fn clock(&self) -> Arc<dyn Clock>;

    /// This process's wake-up signal for the store: raised after every
    /// commit of this process that gives a loop work (an append for the
    /// relay, a receive for the applier).
    fn signal(&self) -> Signal;

    /// Whether another process may have committed to the store since the
    /// last call; called while a loop idles, so it must be cheap (a read of
    /// a counter the database keeps, a look at pending notifications). A
    /// false positive costs one empty round; `false` (the default) leaves
    /// such commits to the loop's poll.
    fn changed_elsewhere(&mut self) -> Result<bool, StoreError> {
        Ok(false)
    }
}

/// A consumer store whose apply loop can be observed: how long each
/// applied event waited since it was received.
pub trait RunConsumer: ConsumerStore + RunStore {
    /// When `event` was received, read inside the apply transaction `tx`;
    /// `None` when no such row is stored.
    fn received_at_ms(tx: &Self::Tx, event: &Envelope) -> Result<Option<i64>, StoreError>;
}
