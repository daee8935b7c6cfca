//! The inbox's own guards, for every backend: a row settled, or a cursor
//! moved, by anything but the apply that holds the flow is never marked
//! over or moved back; the apply fails as a corrupt store and writes
//! nothing. Each backend's test hands in the handler that does the damage
//! in its own SQL, and a reader of the flow's stored cursor.

use ordo_core::{ConsumerStore, Envelope, ErrorKind, InboxStatus, StoreError};

use crate::support::{envelope, inbox_flow};

/// The one event the guards' tests receive, at flow `f` seq 1.
pub fn guarded_event() -> Envelope {
    envelope("f-1", "f", 1, 1, "noted", serde_json::json!({}))
}

/// `apply_next_with` (`batch` false) or `apply_batch_with` of flow `f`.
fn apply_f<C, H>(inbox: &mut C, handler: &mut H, batch: bool) -> Result<(), StoreError>
where
    C: ConsumerStore + ?Sized,
    H: ordo_core::ApplyHandler<C::Tx>,
{
    if batch {
        inbox
            .apply_batch_with(&[(inbox_flow("f"), None)], 10, handler)
            .map(drop)
    } else {
        inbox.apply_next_with(&inbox_flow("f"), handler).map(drop)
    }
}

/// Receives [`guarded_event`], then applies it, alone and in a batch, with
/// `damage`, a handler that writes ordo's own tables (settles the row, or
/// moves the cursor past it) and answers `Apply`: each apply must fail as
/// a corrupt store, leave the row pending and the cursor (`cursor` reads
/// it) where it was.
pub fn damage_under_apply_is_refused<C, H>(
    inbox: &mut C,
    mut damage: H,
    cursor: impl Fn() -> Option<i64>,
) where
    C: ConsumerStore + ?Sized,
    H: ordo_core::ApplyHandler<C::Tx>,
{
    inbox.receive(&guarded_event()).expect("received");
    let before = cursor();
    for batch in [false, true] {
        let error = apply_f(inbox, &mut damage, batch).expect_err("refused");
        assert_eq!(error.kind(), ErrorKind::Corrupt, "batch {batch}: {error}");
        let statuses: Vec<_> = inbox
            .inbox()
            .expect("read")
            .into_iter()
            .map(|r| r.status)
            .collect();
        assert_eq!(statuses, [InboxStatus::Pending], "batch {batch}");
        assert_eq!(cursor(), before, "batch {batch}: nothing was committed");
    }
}
