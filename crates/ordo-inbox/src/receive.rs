//! One delivery into the inbox: the size, the batch, the producers the
//! caller may deliver for, then one transaction.

use ordo_core::ops::ConsumerStatus;
use ordo_core::{Answer, Envelope, ErrorKind, ProducerName, StoreError, StoreId};

use crate::batch::{parse_batch, BatchError};
use crate::pool::Pool;

/// What one delivery may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxLimits {
    /// The most envelopes of one delivery.
    pub max_batch: usize,
    /// The largest body of one delivery, in bytes.
    pub max_body_bytes: u64,
}

/// Who delivered a batch, as the transport authenticated it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The key the delivery was signed with; `None` when the transport
    /// authenticates no one.
    pub key_id: Option<String>,
    /// The producer that key is bound to: an envelope of any other producer
    /// is refused ([`Refusal::NotAllowed`]). `None` when the key may
    /// deliver for every producer, or no one is authenticated.
    pub producer: Option<ProducerName>,
    /// The identity of the producer store that delivered it, as the
    /// transport was told (over HTTP the request's `ordo-store-id`);
    /// `None` when unknown. Stored with each row it delivers; a conflict
    /// with a row of the same sender is cause `producer_rewound`
    /// (PROTOCOL.md section 12).
    pub sender_store_id: Option<StoreId>,
}

/// Why a delivery was not stored. Nothing of it was.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The body is larger than [`InboxLimits::max_body_bytes`].
    #[error("the body is larger than {max_body_bytes} bytes")]
    TooLarge {
        /// The limit.
        max_body_bytes: u64,
    },
    /// The body is not a batch of envelopes; with the item's 0-based
    /// position in an array when one item is at fault.
    #[error("{message}")]
    Malformed {
        /// The position of the malformed item, `None` for the body as a
        /// whole or a single envelope.
        index: Option<usize>,
        /// What is wrong.
        message: String,
        /// The batch holds more than [`InboxLimits::max_batch`] items.
        too_many: bool,
    },
    /// The caller's key is bound to a producer and an envelope is of
    /// another one (an envelope without `producer` is producer `default`).
    #[error(
        "key {} is bound to producer {bound} and may not deliver an envelope of producer {producer}",
        .key_id.as_deref().unwrap_or("-")
    )]
    NotAllowed {
        /// The 0-based position of the first such envelope (0 for a single
        /// envelope, HTTP.md).
        index: usize,
        /// The caller's key.
        key_id: Option<String>,
        /// The producer the key is bound to.
        bound: ProducerName,
        /// The envelope's producer.
        producer: ProducerName,
    },
    /// The store is busy (another writer holds it): retry later.
    #[error("the store is busy: {0}")]
    Busy(StoreError),
    /// The store failed; receive is idempotent, so a retry is safe.
    #[error("the store failed (retry; receive is idempotent): {0}")]
    Storage(StoreError),
}

impl From<BatchError> for Refusal {
    fn from(error: BatchError) -> Refusal {
        match error {
            BatchError::TooMany { .. } => Refusal::Malformed {
                index: None,
                message: error.to_string(),
                too_many: true,
            },
            BatchError::Item { index, error } => Refusal::Malformed {
                index,
                message: format!("malformed envelope: {error}"),
                too_many: false,
            },
            BatchError::Body(message) => Refusal::Malformed {
                index: None,
                message,
                too_many: false,
            },
        }
    }
}

impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Refusal {
        match error.kind() {
            ErrorKind::Busy => Refusal::Busy(error),
            _ => Refusal::Storage(error),
        }
    }
}

/// A delivery stored in one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// One answer per envelope, in order.
    pub answers: Vec<Answer>,
    /// The identity of the consumer store that holds them.
    pub store_id: StoreId,
}

/// The inbox of one consumer store.
pub struct Inbox {
    pool: Pool,
    limits: InboxLimits,
}

impl Inbox {
    /// An inbox storing through `pool`'s handles within `limits`.
    pub fn new(pool: Pool, limits: InboxLimits) -> Inbox {
        assert!(limits.max_batch > 0, "a delivery may hold an envelope");
        Inbox { pool, limits }
    }

    /// The limits of one delivery.
    pub fn limits(&self) -> InboxLimits {
        self.limits
    }

    /// Checks and parses a delivery's body, then checks that `caller` may
    /// deliver every envelope of it; blocks on nothing.
    pub fn parse(&self, caller: &Caller, body: &[u8]) -> Result<Vec<Envelope>, Refusal> {
        if body.len() as u64 > self.limits.max_body_bytes {
            return Err(Refusal::TooLarge {
                max_body_bytes: self.limits.max_body_bytes,
            });
        }
        let envelopes = parse_batch(body, self.limits.max_batch)?;
        assert!(!envelopes.is_empty() && envelopes.len() <= self.limits.max_batch);
        check_producers(caller, &envelopes)?;
        Ok(envelopes)
    }

    /// Stores parsed envelopes in one transaction; blocks. One answer per
    /// envelope, in order, with the consumer store's identity. Envelopes
    /// `caller` may not deliver are refused here too, so that no transport
    /// stores them.
    pub fn store(&self, caller: &Caller, envelopes: &[Envelope]) -> Result<Stored, Refusal> {
        check_producers(caller, envelopes)?;
        let stored = self.pool.with_store(|store| {
            let answers = store.receive_from(caller.sender_store_id.as_ref(), envelopes)?;
            Ok(Stored {
                answers,
                store_id: store.store_id().clone(),
            })
        })?;
        assert_eq!(
            stored.answers.len(),
            envelopes.len(),
            "one answer per envelope"
        );
        tracing::debug!(
            key_id = caller.key_id.as_deref().unwrap_or("-"),
            sender_store_id = caller.sender_store_id.as_ref().map_or("-", StoreId::as_str),
            items = stored.answers.len(),
            "stored"
        );
        Ok(stored)
    }

    /// [`Inbox::parse`] then [`Inbox::store`]: a delivery's answers, with
    /// its envelopes.
    pub fn receive(
        &self,
        caller: &Caller,
        body: &[u8],
    ) -> Result<(Vec<Envelope>, Stored), Refusal> {
        let envelopes = self.parse(caller, body)?;
        let stored = self.store(caller, &envelopes)?;
        Ok((envelopes, stored))
    }

    /// The inbox's counts (pending, blocked, gaps); blocks.
    pub fn status(&self) -> Result<ConsumerStatus, StoreError> {
        self.pool.with_store(|store| store.consumer_status())
    }
}

/// Refuses the first envelope of a producer other than the one `caller`'s
/// key is bound to, naming its 0-based position (0 for a single envelope).
fn check_producers(caller: &Caller, envelopes: &[Envelope]) -> Result<(), Refusal> {
    let Some(bound) = &caller.producer else {
        return Ok(());
    };
    let Some(index) = envelopes.iter().position(|e| &e.producer != bound) else {
        return Ok(());
    };
    Err(Refusal::NotAllowed {
        index,
        key_id: caller.key_id.clone(),
        bound: bound.clone(),
        producer: envelopes[index].producer.clone(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ordo_core::Receipt;
    use ordo_sqlite::{ConsumerDb, Schema};

    use super::*;

    fn inbox(dir: &std::path::Path, max_batch: usize, max_body_bytes: u64) -> Inbox {
        let path = dir.join("consumer.db");
        let open: crate::Opener = Arc::new(move || {
            let store = ConsumerDb::open(&path, &Schema::new("inbox").unwrap())?;
            Ok(Box::new(store) as Box<dyn ordo_core::ConsumerHandle>)
        });
        let limits = InboxLimits {
            max_batch,
            max_body_bytes,
        };
        Inbox::new(Pool::new(open, 2), limits)
    }

    /// What a refusal must be.
    type Expect = dyn Fn(&Refusal) -> bool;

    const ONE: &str = r#"{"event_id":"f-1","flow_id":"f","seq":1,"schema_version":1,"type":"noted","payload":{}}"#;

    #[test]
    fn a_delivery_is_stored_once_and_again_is_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = inbox(dir.path(), 10, 1 << 20);
        let caller = Caller::default();
        let (envelopes, stored) = inbox.receive(&caller, ONE.as_bytes()).unwrap();
        assert_eq!(envelopes.len(), 1);
        assert_eq!(stored.answers, [Answer::of(Receipt::Accepted)]);
        let (_, again) = inbox.receive(&caller, ONE.as_bytes()).unwrap();
        assert_eq!(again.answers, [Answer::of(Receipt::Duplicate)]);
        assert_eq!(again.store_id, stored.store_id, "one store answers");
        assert_eq!(inbox.status().unwrap().pending, 1);
    }

    #[test]
    fn bad_deliveries_are_refused_and_store_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = inbox(dir.path(), 1, 200);
        let caller = Caller::default();
        let two = format!("[{ONE},{ONE}]");
        let bad_item = format!("[{}]", ONE.replace("\"seq\":1", "\"seq\":0"));
        let cases: Vec<(Vec<u8>, &Expect)> = vec![
            (vec![b' '; 201], &|r| {
                matches!(
                    r,
                    Refusal::TooLarge {
                        max_body_bytes: 200
                    }
                )
            }),
            (b"nope".to_vec(), &|r| {
                matches!(
                    r,
                    Refusal::Malformed {
                        index: None,
                        too_many: false,
                        ..
                    }
                )
            }),
            (b"[]".to_vec(), &|r| {
                matches!(r, Refusal::Malformed { index: None, .. })
            }),
            (two.into_bytes(), &|r| {
                matches!(r, Refusal::Malformed { too_many: true, .. })
            }),
            (bad_item.into_bytes(), &|r| {
                matches!(r, Refusal::Malformed { index: Some(0), .. })
            }),
        ];
        for (body, expected) in cases {
            let refusal = inbox.receive(&caller, &body).unwrap_err();
            assert!(
                expected(&refusal),
                "{refusal:?} for {:?}",
                String::from_utf8_lossy(&body)
            );
        }
        assert_eq!(inbox.status().unwrap().pending, 0, "nothing stored");
    }

    fn bound(key_id: &str, producer: &str) -> Caller {
        Caller {
            key_id: Some(key_id.to_owned()),
            producer: Some(ProducerName::new(producer).unwrap()),
            ..Caller::default()
        }
    }

    /// An envelope of flow `flow` naming `producer`.
    fn of(producer: &str, flow: &str) -> String {
        format!(
            r#"{{"event_id":"{flow}-1","flow_id":"{flow}","seq":1,"schema_version":1,"type":"noted","payload":{{}},"producer":"{producer}"}}"#
        )
    }

    #[test]
    fn a_bound_key_delivers_only_its_producers_envelopes() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = inbox(dir.path(), 10, 1 << 20);
        let orders = bound("k1", "orders");
        let foreign = [
            (format!("[{},{}]", of("orders", "a"), of("billing", "b")), 1),
            (format!("[{ONE}]"), 0),
            (of("billing", "b"), 0),
            (ONE.to_owned(), 0),
        ];
        for (body, index) in foreign {
            let refusal = inbox.receive(&orders, body.as_bytes()).unwrap_err();
            let Refusal::NotAllowed {
                index: refused,
                key_id,
                bound,
                producer,
            } = &refusal
            else {
                panic!("{refusal:?} for {body}");
            };
            assert_eq!(*refused, index, "{body}");
            assert_eq!(key_id.as_deref(), Some("k1"));
            assert_eq!(bound.as_str(), "orders");
            assert_ne!(producer.as_str(), "orders");
            let said = refusal.to_string();
            assert!(said.contains("k1") && said.contains("orders"), "{said}");
        }
        assert_eq!(inbox.status().unwrap().pending, 0, "nothing stored");
        let envelopes = inbox.parse(&Caller::default(), ONE.as_bytes()).unwrap();
        let refusal = inbox.store(&orders, &envelopes).unwrap_err();
        assert!(
            matches!(refusal, Refusal::NotAllowed { index: 0, .. }),
            "{refusal:?}"
        );
        assert_eq!(inbox.status().unwrap().pending, 0, "nothing stored");
        let own = format!("[{},{}]", of("orders", "a"), of("orders", "b"));
        let (_, stored) = inbox.receive(&orders, own.as_bytes()).unwrap();
        assert_eq!(stored.answers.len(), 2);
        let (_, stored) = inbox
            .receive(&bound("k2", "default"), ONE.as_bytes())
            .unwrap();
        assert_eq!(stored.answers, [Answer::of(Receipt::Accepted)]);
        let unbound = Caller {
            key_id: Some("k3".to_owned()),
            ..Caller::default()
        };
        let (_, stored) = inbox
            .receive(&unbound, of("billing", "c").as_bytes())
            .unwrap();
        assert_eq!(stored.answers, [Answer::of(Receipt::Accepted)]);
        assert_eq!(inbox.status().unwrap().pending, 4);
    }

    #[test]
    fn a_store_that_cannot_open_is_a_storage_refusal() {
        let open: crate::Opener =
            Arc::new(|| Err(StoreError::new(ErrorKind::NotFound, "no such store")));
        let limits = InboxLimits {
            max_batch: 1,
            max_body_bytes: 1 << 20,
        };
        let inbox = Inbox::new(Pool::new(open, 1), limits);
        let refusal = inbox
            .receive(&Caller::default(), ONE.as_bytes())
            .unwrap_err();
        assert!(matches!(refusal, Refusal::Storage(_)), "{refusal:?}");
        let busy = Refusal::from(StoreError::new(ErrorKind::Busy, "locked"));
        assert!(matches!(busy, Refusal::Busy(_)));
    }
}
