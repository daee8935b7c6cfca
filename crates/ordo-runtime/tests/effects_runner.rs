//! The runner's effects loop beside its apply loop, on one real SQLite
//! file: intents the handler records are run as they commit, in order per
//! flow, and a stop reports what was done.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ordo_core::effect::{Answer, EffectFilter, EffectOps, EffectPolicy, EffectState};
use ordo_core::{ApplyContext, Envelope, Receive, StoreError, SystemClock, Verdict};
use ordo_runtime::{Executor, Runner, RunnerOptions};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, Schema};
use serde_json::json;

const FLOWS: i64 = 5;
const SEQS: i64 = 4;

fn event(flow: i64, seq: i64) -> Envelope {
    Envelope::parse_str(&format!(
        r#"{{"event_id": "f{flow}-{seq}", "flow_id": "f{flow}", "seq": {seq},
            "schema_version": 1, "type": "placed", "payload": {{}}}}"#
    ))
    .unwrap()
}

fn notify(cx: &mut ApplyContext<Connection>, e: &Envelope) -> Result<Verdict, StoreError> {
    let request = json!({"flow": e.flow_id.as_str(), "seq": e.seq.get()});
    cx.effect("notify", &request)?;
    Ok(Verdict::Apply)
}

#[test]
fn the_effects_loop_runs_what_the_apply_loop_records_in_order_per_flow() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.db");
    let schema = Schema::new("shop").unwrap();
    let mut inbox = ConsumerDb::open(&path, &schema).unwrap();

    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let mut executor = Executor::new("runner-test", Arc::new(SystemClock));
    executor
        .register("notify", EffectPolicy::default(), move |effect| {
            let flow = effect.request["flow"].as_str().unwrap().to_owned();
            let seq = effect.request["seq"].as_i64().unwrap();
            seen.lock().unwrap().push((flow, seq));
            Answer::Succeeded(json!({"sent": true}))
        })
        .unwrap();
    let mut runner = Runner::new(RunnerOptions::default());
    runner
        .spawn_apply(ConsumerDb::open(&path, &schema).unwrap(), notify)
        .unwrap();
    runner
        .spawn_effects(
            ConsumerDb::open(&path, &schema).unwrap(),
            None,
            executor,
            |_| {},
        )
        .unwrap();

    for seq in 1..=SEQS {
        for flow in 1..=FLOWS {
            inbox.receive(&event(flow, seq)).unwrap();
        }
    }
    let total = (FLOWS * SEQS) as usize;
    let deadline = Instant::now() + Duration::from_secs(30);
    while calls.lock().unwrap().len() < total {
        assert!(
            Instant::now() < deadline,
            "the loops ran {:?}",
            calls.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = runner.stop().unwrap();
    assert_eq!(report.apply.applied, total as u64);
    assert_eq!(
        (report.effects.attempted, report.effects.succeeded),
        (total as u64, total as u64)
    );

    let calls = calls.lock().unwrap();
    for flow in 1..=FLOWS {
        let seqs: Vec<i64> = calls
            .iter()
            .filter(|(f, _)| *f == format!("f{flow}"))
            .map(|(_, seq)| *seq)
            .collect();
        assert_eq!(
            seqs,
            (1..=SEQS).collect::<Vec<_>>(),
            "flow f{flow} once each, in order"
        );
    }
    let settled = inbox.effects(&EffectFilter::default(), 1_000).unwrap();
    assert_eq!(settled.len(), total);
    assert!(settled
        .iter()
        .all(|i| i.state == EffectState::Succeeded && i.attempts == 1));
}
