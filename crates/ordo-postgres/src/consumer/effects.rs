//! Effect intents on PostgreSQL: written in the apply transaction of their
//! event. The decisions are `ordo_core::effect`'s.

use ordo_core::effect::Intent;
use ordo_core::StoreError;

use crate::conn::PgTx;

/// Writes `intents`, each `pending` and due at `now_ms`, in one statement.
pub(super) fn insert_intents(tx: &PgTx, intents: &[Intent], now_ms: i64) -> Result<(), StoreError> {
    if intents.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&Intent) -> &str| intents.iter().map(f).collect::<Vec<&str>>();
    let keys = column(|i| i.key.as_str());
    let names = column(|i| i.name.as_str());
    let producers = column(|i| i.producer.as_str());
    let flows = column(|i| i.flow_id.as_str());
    let event_ids = column(|i| i.event_id.as_str());
    let requests = column(|i| i.request.as_str());
    let seqs: Vec<i64> = intents.iter().map(|i| i.seq.get()).collect();
    let positions: Vec<i32> = intents.iter().map(|i| i.position as i32).collect();
    let written = tx.run(
        "consumer: cannot record an effect intent",
        "INSERT INTO {s}.effect_intent (key, name, producer, flow_id, seq, position, event_id,
             request, state, next_attempt_at_ms, recorded_at_ms, updated_at_ms)
         SELECT k, n, p, f, q, o, e, r, 'pending', $9, $9, $9
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                     $6::integer[], $7::text[], $8::text[]) AS u(k, n, p, f, q, o, e, r)",
        &[
            &keys, &names, &producers, &flows, &seqs, &positions, &event_ids, &requests, &now_ms,
        ],
    )?;
    assert_eq!(written, intents.len() as u64, "every intent is written");
    Ok(())
}
