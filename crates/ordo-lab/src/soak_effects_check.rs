//! The providers of `ordo soak --effects` ([`crate::soak_effects`]) and
//! its end check: two fake webhook providers on loopback, a thread per
//! connection, one deduplicating by `Idempotency-Key`, one acting on every
//! request, both answering 503 at random before acting and logging every
//! request; and the checks of both consumers' intents against the soak's
//! end state and the providers' logs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ordo_core::effect::{EffectEntry, EffectState};
use ordo_core::{DestinationName, InboxStatus, OutboxRecord, ProducerOps};
use ordo_testkit::check::{Snapshot, Violation};

use crate::soak::end_violations;
use crate::soak_effects::{behind_unknown, intents, unknown_heads, EffectsReport, SIDES};
use crate::{internal, LabError};

/// How often a provider answers 503 (before acting), in percent.
const UNAVAILABLE_PERCENT: u32 = 10;
/// The longest pause of a provider before it decides an answer, and
/// again before it sends it, in ms.
const CALL_PAUSE_MS: u64 = 60;

// ---------------------------------------------------------------------------
// The providers.

/// One request a provider received.
#[derive(Debug, Clone)]
struct Seen {
    key: String,
    attempt: u32,
    /// 503, or 200.
    status: u16,
    acted: bool,
}

/// What a provider received and did, in arrival order.
#[derive(Debug, Default)]
pub(crate) struct ProviderLog {
    requests: Vec<Seen>,
    /// The first answer of each key acted on (kept by `dedup`).
    answers: BTreeMap<String, String>,
}

impl ProviderLog {
    /// Actions per key.
    fn actions(&self) -> BTreeMap<&str, u64> {
        let mut actions = BTreeMap::new();
        for seen in self.requests.iter().filter(|s| s.acted) {
            *actions.entry(seen.key.as_str()).or_default() += 1;
        }
        actions
    }
}

/// A fake webhook provider on 127.0.0.1, a thread per connection.
pub(crate) struct Provider {
    addr: SocketAddr,
    dedup: bool,
    log: Arc<Mutex<(ProviderLog, fastrand::Rng)>>,
    stop: Arc<AtomicBool>,
}

impl Provider {
    /// Starts a provider: deduplicating by key when `dedup`.
    pub(crate) fn start(dedup: bool, seed: u64) -> Result<Provider, LabError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(internal)?;
        let provider = Provider {
            addr: listener.local_addr().map_err(internal)?,
            dedup,
            log: Arc::new(Mutex::new((
                ProviderLog::default(),
                fastrand::Rng::with_seed(seed),
            ))),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (log, stop) = (provider.log.clone(), provider.stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let log = log.clone();
                std::thread::spawn(move || {
                    let _ = serve_one(stream, dedup, &log);
                });
            }
        });
        Ok(provider)
    }

    /// The URL the side's appliers record.
    pub(crate) fn url(&self) -> String {
        let name = if self.dedup { SIDES[0] } else { SIDES[1] };
        format!("http://{}/hooks/{name}", self.addr)
    }

    /// The prefix its executors allow.
    pub(crate) fn prefix(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// What it saw so far.
    pub(crate) fn take_log(&self) -> ProviderLog {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut log.0)
    }
}

impl Drop for Provider {
    /// Stops accepting connections.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Reads one request from `stream`, answers it and closes the connection.
fn serve_one(
    stream: TcpStream,
    dedup: bool,
    log: &Mutex<(ProviderLog, fastrand::Rng)>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut headers = BTreeMap::new();
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("POST ") {
        return Ok(());
    }
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    let length: u64 = (headers.get("content-length"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    std::io::copy(&mut reader.by_ref().take(length), &mut std::io::sink())?;
    let key = headers.get("idempotency-key").cloned().unwrap_or_default();
    let attempt = (headers.get("ordo-attempt"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // A pause before the answer is decided and another after, so that
    // executors are killed in the middle of calls, before and after the
    // provider acted.
    let pause = || {
        let mut guard = log.lock().unwrap_or_else(|e| e.into_inner());
        Duration::from_millis(guard.1.u64(0..=CALL_PAUSE_MS))
    };
    std::thread::sleep(pause());
    let (status, body) = answer(dedup, log, key, attempt);
    std::thread::sleep(pause());
    let reason = if status == 200 {
        "OK"
    } else {
        "Service Unavailable"
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// The provider's answer to one request of `key`, logged: 503 at random
/// (not acting), else the first answer again for a key `dedup` acted on,
/// else an action.
fn answer(
    dedup: bool,
    log: &Mutex<(ProviderLog, fastrand::Rng)>,
    key: String,
    attempt: u32,
) -> (u16, String) {
    let mut guard = log.lock().unwrap_or_else(|e| e.into_inner());
    let (log, rng) = &mut *guard;
    let mut seen = Seen {
        key,
        attempt,
        status: 503,
        acted: false,
    };
    let (status, body) = if rng.u32(0..100) < UNAVAILABLE_PERCENT {
        (503, r#"{"error":"unavailable"}"#.to_owned())
    } else if let Some(first) = log.answers.get(&seen.key).filter(|_| dedup) {
        (200, first.clone())
    } else {
        seen.acted = true;
        let body = serde_json::json!({"acted": seen.key, "attempt": attempt}).to_string();
        log.answers.insert(seen.key.clone(), body.clone());
        (200, body)
    };
    seen.status = status;
    log.requests.push(seen);
    (status, body)
}

// ---------------------------------------------------------------------------
// The end check.

/// An event's identity at a consumer: (producer, flow, seq).
pub(crate) type EventAt = (String, String, i64);
/// The events committed, the soak's violations, and each side's applied
/// events.
pub(crate) type Ended = (usize, Vec<Violation>, Vec<BTreeSet<EventAt>>);

/// Checks the effects of one side once converged, adding to `report`:
/// one intent per applied event, each posting to the side's provider; on
/// `dedup`, every intent `succeeded` and acted on exactly once; on
/// `plain`, every intent `succeeded` (acted on once), `outcome_unknown`
/// (acted on at most once) or `pending` behind one (never acted on); at
/// either, a key requested again only after a 503 to that key (`plain`),
/// never acted on twice, never sent twice under one attempt number, and no
/// action on a key that no intent has.
fn check_side(
    side: usize,
    intents: &[EffectEntry],
    applied: &BTreeSet<EventAt>,
    url: &str,
    log: &ProviderLog,
    report: &mut EffectsReport,
) {
    let dedup = side == 0;
    let mut v = |what: String| report.violations.push(format!("{}: {what}", SIDES[side]));
    let mut recorded: BTreeMap<EventAt, u64> = BTreeMap::new();
    for i in intents {
        let at = (i.producer.to_string(), i.flow_id.to_string(), i.seq.get());
        *recorded.entry(at.clone()).or_default() += 1;
        if !applied.contains(&at) {
            v(format!("intent {} of an event not applied", i.key.as_str()));
        }
        let request: serde_json::Value = serde_json::from_str(&i.request).unwrap_or_default();
        if request["url"] != url {
            v(format!(
                "intent {} posts to {}",
                i.key.as_str(),
                request["url"]
            ));
        }
    }
    for at in applied {
        let n = recorded.get(at).copied().unwrap_or(0);
        if n != 1 {
            v(format!("{n} intents of the applied event {at:?}"));
        }
    }
    let actions = log.actions();
    let heads = unknown_heads(intents);
    let keys: BTreeSet<&str> = intents.iter().map(|i| i.key.as_str()).collect();
    for i in intents {
        let acted = actions.get(i.key.as_str()).copied().unwrap_or(0);
        let fine = match i.state {
            EffectState::Succeeded => acted == 1,
            EffectState::OutcomeUnknown => !dedup && acted <= 1,
            EffectState::Pending => !dedup && behind_unknown(i, &heads) && acted == 0,
            _ => false,
        };
        if !fine {
            v(format!(
                "intent {} ended {} with {acted} action(s) at the provider",
                i.key.as_str(),
                i.state
            ));
        }
    }
    for key in actions.keys().filter(|k| !keys.contains(*k)) {
        v(format!("the provider acted on {key}, which no intent has"));
    }
    check_requests(dedup, log, report, side);
}

/// Each key's requests in arrival order: a repeat after a 503 is counted;
/// on `plain` any other repeat is a violation; an attempt number twice is.
fn check_requests(dedup: bool, log: &ProviderLog, report: &mut EffectsReport, side: usize) {
    let mut by_key: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
    for seen in &log.requests {
        by_key.entry(seen.key.as_str()).or_default().push(seen);
        report.provider_unavailable[side] += u64::from(seen.status == 503);
        report.provider_actions[side] += u64::from(seen.acted);
        report.answered_from_memory += u64::from(seen.status == 200 && !seen.acted);
    }
    for (key, seen) in by_key {
        let attempts: BTreeSet<u32> = seen.iter().map(|s| s.attempt).collect();
        if attempts.len() != seen.len() {
            report.violations.push(format!(
                "{}: {key} was sent twice under one attempt number ({:?})",
                SIDES[side],
                seen.iter().map(|s| s.attempt).collect::<Vec<_>>()
            ));
        }
        for pair in seen.windows(2) {
            if pair[0].status == 503 {
                report.repeats_after_retry += 1;
            } else if !dedup {
                report.violations.push(format!(
                    "{}: {key} was sent again (attempt {}) after an answer that was not 503",
                    SIDES[side], pair[1].attempt
                ));
            }
        }
    }
}

/// The soak's end state for each destination: every event held and
/// applied once by that destination's consumer, one local effect per
/// (producer, flow, seq), in order, every flow released; the applied
/// events of each side.
pub(crate) fn end_state(
    producer: &Path,
    consumers: &[PathBuf; 2],
    flows: u64,
) -> Result<Ended, LabError> {
    let mut db = ordo_reservation::open_producer(producer)?;
    let (records, outbox) = ordo_reservation::producer_snapshot(&mut db)?;
    let entries = db.outbox_entries(false, outbox.len().max(1))?;
    let (mut violations, mut applied) = (Vec::new(), Vec::new());
    for (side, path) in consumers.iter().enumerate() {
        let destination = DestinationName::new(SIDES[side]).map_err(internal)?;
        let held: BTreeSet<&str> = (entries.iter())
            .filter(|e| (e.destinations.iter()).any(|c| c.destination == destination && c.accepted))
            .map(|e| e.envelope.event_id.as_str())
            .collect();
        let (inbox, projections, effects) =
            ordo_reservation::consumer_snapshot(&mut ordo_reservation::open_consumer(path)?)?;
        applied.push(
            (inbox.iter().filter(|r| r.status == InboxStatus::Applied))
                .map(|r| {
                    let e = &r.envelope;
                    (e.producer.to_string(), e.flow_id.to_string(), e.seq.get())
                })
                .collect(),
        );
        let snapshot = Snapshot {
            flows: records.clone(),
            outbox: (outbox.iter())
                .map(|row| OutboxRecord {
                    envelope: row.envelope.clone(),
                    accepted: held.contains(row.envelope.event_id.as_str()),
                })
                .collect(),
            inbox,
            pruned_inbox: Vec::new(),
            projections,
            effects,
        };
        violations.extend(
            end_violations(&snapshot, flows)?
                .into_iter()
                .map(|v| Violation {
                    detail: format!("{}: {}", SIDES[side], v.detail),
                    ..v
                }),
        );
    }
    Ok((outbox.len(), violations, applied))
}

/// The effects' figures and violations of both sides, once converged.
pub(crate) fn effects_check(
    consumers: &[PathBuf; 2],
    urls: &[String; 2],
    logs: &[ProviderLog; 2],
    applied: &[BTreeSet<EventAt>],
) -> Result<EffectsReport, LabError> {
    let mut report = EffectsReport::default();
    for side in 0..SIDES.len() {
        let intents = intents(&consumers[side])?;
        let heads = unknown_heads(&intents);
        report.intents += intents.len() as u64;
        for i in &intents {
            report.succeeded += u64::from(i.state == EffectState::Succeeded);
            report.outcome_unknown += u64::from(i.state == EffectState::OutcomeUnknown);
            report.waiting_behind_unknown +=
                u64::from(i.state == EffectState::Pending && behind_unknown(i, &heads));
        }
        check_side(
            side,
            &intents,
            &applied[side],
            &urls[side],
            &logs[side],
            &mut report,
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(key: &str, attempt: u32, status: u16, acted: bool) -> Seen {
        Seen {
            key: key.into(),
            attempt,
            status,
            acted,
        }
    }

    fn checked(side: usize, requests: Vec<Seen>) -> EffectsReport {
        let log = ProviderLog {
            requests,
            answers: BTreeMap::new(),
        };
        let mut report = EffectsReport::default();
        check_requests(side == 0, &log, &mut report, side);
        report
    }

    #[test]
    fn a_repeat_after_a_503_is_counted_and_any_other_plain_repeat_is_a_violation() {
        let fine = checked(1, vec![seen("k", 1, 503, false), seen("k", 2, 200, true)]);
        assert!(fine.violations.is_empty(), "{:?}", fine.violations);
        assert_eq!((fine.repeats_after_retry, fine.provider_actions[1]), (1, 1));
        let twice = checked(1, vec![seen("k", 1, 200, true), seen("k", 2, 200, true)]);
        assert!(twice.violations[0].contains("not 503"), "{twice:?}");
        let reused = checked(0, vec![seen("k", 1, 503, false), seen("k", 1, 200, true)]);
        assert!(
            reused.violations[0].contains("attempt number"),
            "{reused:?}"
        );
    }

    #[test]
    fn a_dedup_resend_answered_from_memory_is_no_violation() {
        let report = checked(0, vec![seen("k", 1, 200, true), seen("k", 2, 200, false)]);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.answered_from_memory, 1);
    }

    #[test]
    fn the_dedup_provider_acts_once_per_key_and_the_plain_one_every_time() {
        for dedup in [true, false] {
            let log = Mutex::new((ProviderLog::default(), fastrand::Rng::with_seed(5)));
            for attempt in 1..=40 {
                answer(dedup, &log, "k".into(), attempt);
            }
            let (log, _) = log.into_inner().unwrap();
            let acted = log.requests.iter().filter(|s| s.acted).count();
            let unavailable = log.requests.iter().filter(|s| s.status == 503).count();
            assert!(unavailable > 0 && unavailable < 40, "{unavailable} 503s");
            if dedup {
                assert_eq!(acted, 1);
            } else {
                assert_eq!(acted, 40 - unavailable);
            }
        }
    }
}
