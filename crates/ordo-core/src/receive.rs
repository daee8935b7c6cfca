//! The consumer's receive decisions: what a store holds under an incoming
//! envelope's identities, the receipt it gets, and a delivery decided
//! envelope after envelope, as one call (`decide_batch`) or while the
//! backend stores each accepted one (`decide_and_store`).
//!
//! Invariant: nothing here reads or writes a store; a backend hands in
//! what it read and stores what is accepted.

use std::collections::{HashMap, HashSet};

use crate::envelope::{BodyHash, Envelope};
use crate::error::StoreError;
use crate::identity::StoreId;
use crate::ids::EventId;
use crate::outcome::{Answer, Receipt};

/// What the consumer already stores (or remembers by fingerprint) under an
/// incoming envelope's identities.
#[derive(Debug, Clone, Default)]
pub struct StoredIdentities {
    /// The body hash stored under the incoming `event_id`, if any.
    pub by_event_id: Option<BodyHash>,
    /// The event id stored under the incoming `(flow_id, seq)`, if any.
    pub by_flow_seq: Option<EventId>,
    /// The incoming seq is at or below the flow's prune watermark.
    pub below_watermark: bool,
    /// The producer store that delivered the row (or fingerprint) at the
    /// incoming `(flow_id, seq)`, if known.
    pub from_at_flow_seq: Option<StoreId>,
    /// The producer store that delivered the row (or fingerprint) under the
    /// incoming `event_id`, if known.
    pub from_by_event_id: Option<StoreId>,
}

/// Decides the receipt of an envelope with event id `event_id` whose body
/// hashes to `incoming`. `duplicate` needs both identities to agree: the same
/// body under the event id, and that event id at the envelope's
/// `(flow_id, seq)` (the canonical body writes numbers as doubles, so the
/// hash alone cannot tell seqs above 2^53 apart). A seq at or below the
/// prune watermark with nothing remembered is a conflict: an old seq is never
/// stored again. A conflict whose held row was delivered by `sender`, the
/// same producer store as this delivery, is [`Receipt::ProducerRewound`];
/// an unknown identity (`None`, on either side) never matches.
pub fn decide_receive(
    event_id: &EventId,
    incoming: &BodyHash,
    stored: &StoredIdentities,
    sender: Option<&StoreId>,
) -> Answer {
    let receipt = match (&stored.by_event_id, &stored.by_flow_seq) {
        (Some(hash), Some(id)) if hash == incoming && id == event_id => Receipt::Duplicate,
        (Some(_), _) | (None, Some(_)) => Receipt::Conflict,
        (None, None) if stored.below_watermark => Receipt::Conflict,
        (None, None) => Receipt::Accepted,
    };
    if receipt != Receipt::Conflict {
        return Answer::of(receipt);
    }
    let (held, held_from) = match (&stored.by_flow_seq, &stored.by_event_id) {
        (Some(id), _) => (Some(id.clone()), stored.from_at_flow_seq.as_ref()),
        (None, Some(_)) => (Some(event_id.clone()), stored.from_by_event_id.as_ref()),
        (None, None) => (None, None),
    };
    let rewound = matches!((held_from, sender), (Some(a), Some(b)) if a == b);
    Answer {
        receipt: if rewound {
            Receipt::ProducerRewound
        } else {
            receipt
        },
        held_event_id: held,
    }
}

impl StoredIdentities {
    /// The identities as a backend reads them: the body hash stored under
    /// the event id (hex), the event id stored at the position, whether
    /// the position is at or below the prune watermark, and the delivering
    /// stores of the row under the event id and of the row at the position;
    /// a value that does not decode is a corrupt store.
    pub fn from_columns(
        hash_hex: Option<String>,
        id_at_seq: Option<String>,
        below_watermark: bool,
        (from_by_id, from_at_seq): (Option<String>, Option<String>),
    ) -> Result<StoredIdentities, StoreError> {
        Ok(StoredIdentities {
            from_at_flow_seq: StoreId::stored_sender(from_at_seq)?,
            from_by_event_id: StoreId::stored_sender(from_by_id)?,
            by_event_id: hash_hex
                .map(|hex| {
                    BodyHash::from_hex(&hex)
                        .map_err(|e| StoreError::corrupt("consumer: stored body hash", e))
                })
                .transpose()?,
            by_flow_seq: id_at_seq
                .map(|id| {
                    EventId::new(id)
                        .map_err(|e| StoreError::corrupt("consumer: stored event id", e))
                })
                .transpose()?,
            below_watermark,
        })
    }
}

/// The decisions of one delivery, envelope after envelope: each is
/// decided as if the ones accepted before it in the delivery were stored
/// already, as one delivery after the other would find them, and once an
/// envelope of a flow is a conflict, every later envelope of that flow is
/// [`Receipt::AfterConflict`], stored or not (PROTOCOL.md section 12).
///
/// [`Delivery::decide`] reads nothing of the decider's own making:
/// [`Delivery::record`] adds an answer once the backend has acted on it
/// (stored an accepted envelope), so that a backend may decide an envelope
/// again after a lost insert race.
#[derive(Debug, Default)]
pub struct Delivery<'a> {
    sender: Option<&'a StoreId>,
    by_id: HashMap<(&'a str, &'a str), BodyHash>,
    by_position: HashMap<(&'a str, &'a str, i64), &'a EventId>,
    conflicted: HashSet<(&'a str, &'a str)>,
}

/// An envelope's `(producer, event_id)`: its identity in the inbox.
fn event_key(envelope: &Envelope) -> (&str, &str) {
    (envelope.producer.as_str(), envelope.event_id.as_str())
}

/// An envelope's `(producer, flow_id)`: its flow in the inbox.
fn flow_key(envelope: &Envelope) -> (&str, &str) {
    (envelope.producer.as_str(), envelope.flow_id.as_str())
}

/// An envelope's `(producer, flow_id, seq)`: its position in the inbox.
fn position_key(envelope: &Envelope) -> (&str, &str, i64) {
    let (producer, flow_id) = flow_key(envelope);
    (producer, flow_id, envelope.seq.get())
}

impl<'a> Delivery<'a> {
    /// A delivery from the producer store `sender` (`None`: unknown).
    pub fn from(sender: Option<&'a StoreId>) -> Delivery<'a> {
        Delivery {
            sender,
            ..Delivery::default()
        }
    }

    /// The producer store this delivery came from, if known.
    pub fn sender(&self) -> Option<&'a StoreId> {
        self.sender
    }

    /// [`Receipt::AfterConflict`] when an earlier envelope of `envelope`'s
    /// flow in this delivery was a conflict: its answer, whatever the store
    /// holds (a backend need not read its identities).
    pub fn after_conflict(&self, envelope: &Envelope) -> Option<Answer> {
        let stopped = self.conflicted.contains(&flow_key(envelope));
        stopped.then(|| Answer::of(Receipt::AfterConflict))
    }

    /// The answer for `envelope` (whose body hashes to `hash`), given what
    /// the store held under its identities before the delivery.
    pub fn decide(
        &self,
        envelope: &'a Envelope,
        hash: &BodyHash,
        mut stored: StoredIdentities,
    ) -> Answer {
        if let Some(answer) = self.after_conflict(envelope) {
            return answer;
        }
        let position = position_key(envelope);
        // What this delivery accepted before is held from its own sender.
        if stored.by_event_id.is_none() {
            stored.by_event_id = self.by_id.get(&event_key(envelope)).cloned();
            stored.from_by_event_id = self.sender.cloned();
        }
        if stored.by_flow_seq.is_none() {
            stored.by_flow_seq = self.by_position.get(&position).map(|id| (*id).clone());
            stored.from_at_flow_seq = self.sender.cloned();
        }
        decide_receive(&envelope.event_id, hash, &stored, self.sender)
    }

    /// Adds `envelope`'s answer to the delivery: an accepted one is stored
    /// for the envelopes after it, a conflict stops its flow.
    pub fn record(&mut self, envelope: &'a Envelope, hash: &BodyHash, answer: &Answer) {
        match answer.receipt {
            Receipt::Accepted => {
                self.by_id.insert(event_key(envelope), hash.clone());
                self.by_position
                    .insert(position_key(envelope), &envelope.event_id);
            }
            Receipt::Conflict | Receipt::AfterConflict | Receipt::ProducerRewound => {
                self.conflicted.insert(flow_key(envelope));
            }
            Receipt::Duplicate => {}
        }
    }
}

/// The span of one envelope's receive, with the event's trace context;
/// its `receipt` is recorded once decided.
fn receive_span(envelope: &Envelope) -> tracing::Span {
    crate::trace::event_span!("receive_event", envelope, receipt)
}

/// Decides a batch's answers from what the store held before it
/// (`stored[i]` for `envelopes[i]`), as one [`Delivery`]. Also returns the
/// indices of the accepted envelopes, which the backend stores, with their
/// body hashes (computed once here).
pub fn decide_batch<'a>(
    envelopes: &'a [Envelope],
    stored: Vec<StoredIdentities>,
    sender: Option<&'a StoreId>,
) -> (Vec<Answer>, Vec<(usize, BodyHash)>) {
    assert_eq!(envelopes.len(), stored.len(), "one read per envelope");
    let mut delivery = Delivery::from(sender);
    let mut answers = Vec::with_capacity(envelopes.len());
    let mut accepted = Vec::new();
    for (index, (envelope, stored)) in envelopes.iter().zip(stored).enumerate() {
        let span = receive_span(envelope);
        let _event = span.enter();
        let hash = envelope.body_hash();
        let answer = delivery.decide(envelope, &hash, stored);
        span.record("receipt", answer.receipt.as_str());
        delivery.record(envelope, &hash, &answer);
        if answer.receipt == Receipt::Accepted {
            accepted.push((index, hash));
        }
        answers.push(answer);
    }
    assert_eq!(answers.len(), envelopes.len(), "one answer per envelope");
    (answers, accepted)
}

/// How a backend stores the envelopes of one delivery while
/// [`decide_and_store`] decides them, one after the other, in its open
/// transaction. `index` is the envelope's place in the delivery.
pub trait ReceiveRows {
    /// Stores the envelope at `index` (its body hashing to `hash`) as
    /// accepted if the store holds nothing under either of its identities
    /// and remembers nothing of them, and says whether it did. A backend
    /// that cannot tell without reading (pruning left fingerprints or
    /// watermarks) stores nothing and answers `false`.
    fn store_if_free(&mut self, index: usize, hash: &BodyHash) -> Result<bool, StoreError>;

    /// What the store holds under the identities of the envelope at
    /// `index`, the envelopes stored before it in this delivery included.
    fn identities(&mut self, index: usize) -> Result<StoredIdentities, StoreError>;

    /// Stores the envelope at `index` as accepted.
    fn store(&mut self, index: usize, hash: &BodyHash) -> Result<(), StoreError>;
}

/// Decides a delivery's answers as [`decide_batch`] does, storing each
/// accepted envelope through `rows` before the next is decided: one whose
/// identities are both free is stored without a read first
/// ([`ReceiveRows::store_if_free`]), which is the answer `accepted`; any
/// other is decided from what its identities hold. Only this function
/// decides; a backend only reads and stores.
pub fn decide_and_store<'a>(
    envelopes: &'a [Envelope],
    sender: Option<&'a StoreId>,
    rows: &mut impl ReceiveRows,
) -> Result<Vec<Answer>, StoreError> {
    let mut delivery = Delivery::from(sender);
    let mut answers = Vec::with_capacity(envelopes.len());
    for (index, envelope) in envelopes.iter().enumerate() {
        let span = receive_span(envelope);
        let _event = span.enter();
        let hash = envelope.body_hash();
        let answer = match delivery.after_conflict(envelope) {
            Some(answer) => answer,
            None if rows.store_if_free(index, &hash)? => {
                // Nothing under either identity, in the store or earlier
                // in this delivery (what it accepted is stored).
                let answer = delivery.decide(envelope, &hash, StoredIdentities::default());
                if answer.receipt != Receipt::Accepted {
                    return Err(StoreError::corrupt(
                        "consumer: receive",
                        format!(
                            "event {} was stored as free while this delivery holds its identity",
                            envelope.event_id
                        ),
                    ));
                }
                answer
            }
            None => {
                let answer = delivery.decide(envelope, &hash, rows.identities(index)?);
                if answer.receipt == Receipt::Accepted {
                    rows.store(index, &hash)?;
                }
                answer
            }
        };
        span.record("receipt", answer.receipt.as_str());
        delivery.record(envelope, &hash, &answer);
        answers.push(answer);
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::ids::{FlowId, InboxFlow, ProducerName};

    fn envelope(flow: &str, seq: i64, amount: i64) -> Envelope {
        let flow_id = FlowId::new(flow).unwrap();
        let payload = serde_json::json!({ "amount": amount });
        let version = crate::ids::SchemaVersion::V1;
        crate::append::next_event(&flow_id, seq - 1, "noted", version, &payload).unwrap()
    }

    /// Two producers' flows of one id are two flows: the same ids and seqs
    /// of another producer are new, and one's conflict stops only its own.
    #[test]
    fn a_batch_keeps_each_producers_namespace() {
        use Receipt::{Accepted, AfterConflict, Conflict};
        let of = |producer: &str, envelope: Envelope| Envelope {
            producer: ProducerName::new(producer).unwrap(),
            ..envelope
        };
        let (a1, a1_other, a2) = (
            envelope("a", 1, 1),
            envelope("a", 1, 2),
            envelope("a", 2, 1),
        );
        let batch = vec![
            a1.clone(),
            of("orders", a1_other.clone()),
            a1_other.clone(),
            of("orders", a2.clone()),
            a2.clone(),
        ];
        let stored = vec![StoredIdentities::default(); batch.len()];
        let (answers, accepted) = decide_batch(&batch, stored, None);
        let receipts: Vec<Receipt> = answers.iter().map(|a| a.receipt).collect();
        assert_eq!(
            receipts,
            vec![Accepted, Accepted, Conflict, Accepted, AfterConflict]
        );
        assert_eq!(answers[2].held_event_id, Some(a1.event_id.clone()));
        let indices: Vec<usize> = accepted.iter().map(|(i, _)| *i).collect();
        assert_eq!(indices, vec![0, 1, 3]);
        assert_ne!(batch[0].inbox_flow(), batch[1].inbox_flow());
        assert!(batch[1].is_of(&InboxFlow::new(
            ProducerName::new("orders").unwrap(),
            a1.flow_id.clone()
        )));
    }

    /// Each envelope of a batch sees those accepted before it in the
    /// batch as stored; nothing stored before: the receipts in order.
    #[test]
    fn a_batch_is_decided_in_order() {
        use Receipt::{Accepted, AfterConflict, Conflict, Duplicate};
        let a1 = envelope("a", 1, 1);
        let a1_other = envelope("a", 1, 2);
        let a2 = envelope("a", 2, 1);
        let b1 = envelope("b", 1, 1);
        let held = |id: &Envelope| Some(id.event_id.clone());
        let answer = |receipt| Answer::of(receipt);
        let conflict = |held_event_id| Answer {
            receipt: Conflict,
            held_event_id,
        };
        let cases: Vec<(Vec<Envelope>, Vec<Answer>, Vec<usize>)> = vec![
            (vec![], vec![], vec![]),
            (
                vec![a1.clone(), a2.clone()],
                vec![answer(Accepted), answer(Accepted)],
                vec![0, 1],
            ),
            (
                vec![a1.clone(), a1.clone()],
                vec![answer(Accepted), answer(Duplicate)],
                vec![0],
            ),
            (
                vec![a1.clone(), a1_other.clone()],
                vec![answer(Accepted), conflict(held(&a1))],
                vec![0],
            ),
            // Nothing of a flow after its conflict, stored or not; other
            // flows go on.
            (
                vec![
                    a1_other.clone(),
                    a1.clone(),
                    a2.clone(),
                    b1.clone(),
                    a1.clone(),
                ],
                vec![
                    answer(Accepted),
                    conflict(held(&a1_other)),
                    answer(AfterConflict),
                    answer(Accepted),
                    answer(AfterConflict),
                ],
                vec![0, 3],
            ),
        ];
        for (batch, answers, accepted) in cases {
            let stored = vec![StoredIdentities::default(); batch.len()];
            let (got, hashes) = decide_batch(&batch, stored, None);
            let indices: Vec<usize> = hashes.iter().map(|(i, _)| *i).collect();
            assert_eq!((got, indices), (answers, accepted), "{batch:?}");
            for (i, hash) in hashes {
                assert_eq!(hash, batch[i].body_hash(), "the hash of what is stored");
            }
        }
        let stored =
            StoredIdentities::from_columns(None, Some("a-1".into()), false, (None, None)).unwrap();
        let (answers, accepted) = decide_batch(
            &[envelope("a", 1, 3), a2],
            vec![stored, StoredIdentities::default()],
            None,
        );
        assert_eq!(answers, vec![conflict(held(&a1)), answer(AfterConflict)]);
        assert!(accepted.is_empty());
        let bad = StoredIdentities::from_columns(Some("zz".into()), None, false, (None, None))
            .unwrap_err();
        assert_eq!(bad.kind(), ErrorKind::Corrupt);
        let not_a_store = (None, Some("x".into()));
        let bad = StoredIdentities::from_columns(None, None, false, not_a_store).unwrap_err();
        assert_eq!(bad.kind(), ErrorKind::Corrupt);
    }

    /// Rows kept in memory, as a store keeps them: by event id and by
    /// position, each with the store that delivered it; `free` says
    /// whether the insert is tried first.
    struct MemoryRows<'a> {
        envelopes: &'a [Envelope],
        sender: Option<&'a StoreId>,
        free: bool,
        by_id: HashMap<(String, String), (BodyHash, Option<StoreId>)>,
        by_position: HashMap<(String, String, i64), (EventId, Option<StoreId>)>,
        stored: Vec<usize>,
        reads: usize,
    }

    impl MemoryRows<'_> {
        fn holds(&self, e: &Envelope) -> bool {
            let id = (e.producer.to_string(), e.event_id.to_string());
            let at = (e.producer.to_string(), e.flow_id.to_string(), e.seq.get());
            self.by_id.contains_key(&id) || self.by_position.contains_key(&at)
        }
    }

    impl ReceiveRows for MemoryRows<'_> {
        fn store_if_free(&mut self, index: usize, hash: &BodyHash) -> Result<bool, StoreError> {
            if !self.free || self.holds(&self.envelopes[index]) {
                return Ok(false);
            }
            self.store(index, hash)?;
            Ok(true)
        }

        fn identities(&mut self, index: usize) -> Result<StoredIdentities, StoreError> {
            self.reads += 1;
            let e = &self.envelopes[index];
            let id = self
                .by_id
                .get(&(e.producer.to_string(), e.event_id.to_string()));
            let at = (e.producer.to_string(), e.flow_id.to_string(), e.seq.get());
            let at = self.by_position.get(&at);
            Ok(StoredIdentities {
                by_event_id: id.map(|(hash, _)| hash.clone()),
                from_by_event_id: id.and_then(|(_, from)| from.clone()),
                by_flow_seq: at.map(|(id, _)| id.clone()),
                from_at_flow_seq: at.and_then(|(_, from)| from.clone()),
                below_watermark: false,
            })
        }

        fn store(&mut self, index: usize, hash: &BodyHash) -> Result<(), StoreError> {
            let e = &self.envelopes[index];
            assert!(!self.holds(e), "stored only where free");
            let from = self.sender.cloned();
            let id = (e.producer.to_string(), e.event_id.to_string());
            self.by_id.insert(id, (hash.clone(), from.clone()));
            let at = (e.producer.to_string(), e.flow_id.to_string(), e.seq.get());
            self.by_position.insert(at, (e.event_id.clone(), from));
            self.stored.push(index);
            Ok(())
        }
    }

    /// Storing each envelope as it is decided, the insert tried first or
    /// not, gives the answers of deciding the batch from an empty store,
    /// stores exactly the accepted ones, and reads identities only for an
    /// envelope whose insert found one held.
    #[test]
    fn deciding_while_storing_answers_as_a_batch_does() {
        let (a1, a1_other, a2, b1) = (
            envelope("a", 1, 1),
            envelope("a", 1, 2),
            envelope("a", 2, 1),
            envelope("b", 1, 1),
        );
        let sender = StoreId::new("0123456789abcdef0123456789abcdef").unwrap();
        let batches = [
            vec![a1.clone(), a2.clone(), b1.clone()],
            vec![a1.clone(), a1.clone(), a2.clone()],
            vec![
                a1.clone(),
                a1_other.clone(),
                a2.clone(),
                b1.clone(),
                a1.clone(),
            ],
            vec![a1_other.clone(), b1.clone(), a1.clone(), b1.clone()],
        ];
        for batch in &batches {
            for sender in [None, Some(&sender)] {
                let stored = vec![StoredIdentities::default(); batch.len()];
                let (want, accepted) = decide_batch(batch, stored, sender);
                let accepted: Vec<usize> = accepted.iter().map(|(i, _)| *i).collect();
                for free in [true, false] {
                    let mut rows = MemoryRows {
                        envelopes: batch,
                        sender,
                        free,
                        by_id: HashMap::new(),
                        by_position: HashMap::new(),
                        stored: Vec::new(),
                        reads: 0,
                    };
                    let got = decide_and_store(batch, sender, &mut rows).unwrap();
                    assert_eq!(got, want, "{batch:?} free {free}");
                    assert_eq!(rows.stored, accepted, "{batch:?} free {free}");
                    let after = want
                        .iter()
                        .filter(|a| a.receipt == Receipt::AfterConflict)
                        .count();
                    let reads = if free {
                        batch.len() - accepted.len() - after
                    } else {
                        batch.len() - after
                    };
                    assert_eq!(rows.reads, reads, "{batch:?} free {free}");
                }
            }
        }
    }

    /// A backend that stores an envelope whose identity the delivery
    /// already holds is refused as corrupt, not answered `accepted`.
    #[test]
    fn a_row_stored_over_a_held_identity_is_corrupt() {
        struct Always;
        impl ReceiveRows for Always {
            fn store_if_free(&mut self, _: usize, _: &BodyHash) -> Result<bool, StoreError> {
                Ok(true)
            }
            fn identities(&mut self, _: usize) -> Result<StoredIdentities, StoreError> {
                unreachable!("every insert is taken")
            }
            fn store(&mut self, _: usize, _: &BodyHash) -> Result<(), StoreError> {
                unreachable!("every insert is taken")
            }
        }
        let a1 = envelope("a", 1, 1);
        let error = decide_and_store(&[a1.clone(), a1], None, &mut Always).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    }

    #[test]
    fn receive_decisions() {
        use Receipt::{Accepted, Conflict, Duplicate};
        let a = BodyHash::of("a");
        let b = BodyHash::of("b");
        let me = EventId::new("me").unwrap();
        let other = EventId::new("other").unwrap();
        let stored =
            |hash: Option<&BodyHash>, at_seq: Option<&EventId>, below: bool| StoredIdentities {
                by_event_id: hash.cloned(),
                by_flow_seq: at_seq.cloned(),
                below_watermark: below,
                ..StoredIdentities::default()
            };
        // The held event: the one at the position, else the one under the
        // incoming id; none when only the watermark remains.
        let cases = [
            (stored(None, None, false), Accepted, None),
            (stored(Some(&a), Some(&me), false), Duplicate, None),
            (stored(Some(&a), Some(&me), true), Duplicate, None),
            (stored(Some(&b), Some(&me), false), Conflict, Some(&me)),
            (stored(None, Some(&other), false), Conflict, Some(&other)),
            // same body under the id, but another seq: the hash cannot tell
            (stored(Some(&a), None, false), Conflict, Some(&me)),
            (
                stored(Some(&a), Some(&other), false),
                Conflict,
                Some(&other),
            ),
            (stored(None, None, true), Conflict, None),
        ];
        for (stored, receipt, held) in cases {
            let expected = Answer {
                receipt,
                held_event_id: held.cloned(),
            };
            assert_eq!(
                decide_receive(&me, &a, &stored, None),
                expected,
                "{stored:?}"
            );
        }
    }

    #[test]
    fn a_conflict_with_a_row_of_the_same_sender_is_a_rewound_producer() {
        use Receipt::{Conflict, Duplicate, ProducerRewound};
        let (a, b) = (BodyHash::of("a"), BodyHash::of("b"));
        let me = EventId::new("me").unwrap();
        let other = EventId::new("other").unwrap();
        let store = |digit: &str| StoreId::new(digit.repeat(32)).unwrap();
        let (s1, s2) = (store("1"), store("2"));
        let held =
            |at_seq: Option<&EventId>, from_at: Option<&StoreId>, from_id: Option<&StoreId>| {
                StoredIdentities {
                    by_event_id: from_id.map(|_| b.clone()),
                    by_flow_seq: at_seq.cloned(),
                    from_at_flow_seq: from_at.cloned(),
                    from_by_event_id: from_id.cloned(),
                    below_watermark: false,
                }
            };
        let cases = [
            // another event at the position, delivered by this sender
            (
                held(Some(&other), Some(&s1), None),
                Some(&s1),
                ProducerRewound,
            ),
            (held(Some(&other), Some(&s1), None), Some(&s2), Conflict),
            // unknown on either side never matches
            (held(Some(&other), None, None), Some(&s1), Conflict),
            (held(Some(&other), Some(&s1), None), None, Conflict),
            // no row at the position: the row under the event id decides
            (held(None, None, Some(&s1)), Some(&s1), ProducerRewound),
            (held(None, None, Some(&s2)), Some(&s1), Conflict),
            // the row at the position decides over the one under the id
            (
                held(Some(&other), Some(&s2), Some(&s1)),
                Some(&s1),
                Conflict,
            ),
        ];
        for (stored, sender, receipt) in cases {
            let answer = decide_receive(&me, &a, &stored, sender);
            assert_eq!(answer.receipt, receipt, "{stored:?} from {sender:?}");
            assert!(
                answer.held_event_id.is_some(),
                "a conflict names the held event"
            );
        }
        let same = StoredIdentities {
            by_event_id: Some(a.clone()),
            by_flow_seq: Some(me.clone()),
            from_at_flow_seq: Some(s1.clone()),
            from_by_event_id: Some(s1.clone()),
            below_watermark: false,
        };
        assert_eq!(decide_receive(&me, &a, &same, Some(&s1)).receipt, Duplicate);
        // Within one delivery, what it accepted before is held from its sender.
        let first = envelope("f", 1, 1);
        let again = envelope("f", 1, 2);
        let (answers, _) = decide_batch(
            &[first, again],
            vec![StoredIdentities::default(); 2],
            Some(&s1),
        );
        assert_eq!(answers[1].receipt, ProducerRewound);
    }
}
