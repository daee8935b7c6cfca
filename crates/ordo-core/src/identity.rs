//! Store identities: the random name every store, producer or consumer,
//! is given once, when it is created (or, for a store of an earlier
//! release, at its first open by this one), and keeps for its whole life.
//! A consumer records the identity of the store that delivered each event,
//! and a producer's destination the identity of the consumer it delivers
//! to, so that a store restored from a backup, or a consumer that is not
//! the one first delivered to, can be told apart (PROTOCOL.md section 12).
//!
//! Invariant: an identity is 32 lowercase hexadecimal digits; the backends
//! generate it in SQL and this type only checks what they read back.

use crate::error::{ErrorKind, StoreError};

/// How many hexadecimal digits a store identity has (128 random bits).
pub const STORE_ID_LEN: usize = 32;

crate::ids::checked_string! {
    /// A store's identity: [`STORE_ID_LEN`] lowercase hexadecimal digits.
    #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct StoreId;
    /// Checks `text` as a store identity.
    new: store_id => InvalidStoreId;
}

/// `text` if it is [`STORE_ID_LEN`] lowercase hexadecimal digits.
fn store_id(text: String) -> Result<String, InvalidStoreId> {
    let well_formed =
        text.len() == STORE_ID_LEN && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if well_formed {
        Ok(text)
    } else {
        Err(InvalidStoreId(text))
    }
}

impl StoreId {
    /// The identity a store read from its own metadata (`place` names the
    /// store): a missing or ill-formed one is a damaged store.
    pub fn stored(place: &str, text: Option<String>) -> Result<StoreId, StoreError> {
        let text = text.ok_or_else(|| {
            StoreError::new(
                ErrorKind::Corrupt,
                format!("{place}: the store records no identity (store_id)"),
            )
        })?;
        StoreId::new(text).map_err(|e| StoreError::new(ErrorKind::Corrupt, format!("{place}: {e}")))
    }

    /// The producer store a consumer's row records as its sender (`None`:
    /// unknown); a value that is no identity is a corrupt store.
    pub fn stored_sender(text: Option<String>) -> Result<Option<StoreId>, StoreError> {
        text.map(|id| StoreId::stored("consumer: the delivering store of an inbox row", Some(id)))
            .transpose()
    }
}

/// Text that is not a store identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store_id {0:?} is not {STORE_ID_LEN} lowercase hexadecimal digits")]
pub struct InvalidStoreId(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_32_lowercase_hex_digits() {
        let id = StoreId::new("0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(id.as_str(), "0123456789abcdef0123456789abcdef");
        assert_eq!(id.to_string(), id.as_str());
        for bad in [
            "",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "0123456789ABCDEF0123456789abcdef",
            "0123456789abcdef0123456789abcdeg",
            "0123456789abcdef-123456789abcdef",
        ] {
            assert_eq!(
                StoreId::new(bad),
                Err(InvalidStoreId(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_missing_or_damaged_stored_identity_is_corrupt() {
        let missing = StoreId::stored("p.db", None).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::Corrupt);
        assert!(missing
            .to_string()
            .contains("p.db: the store records no identity"));
        let damaged = StoreId::stored("p.db", Some("xyz".into())).unwrap_err();
        assert_eq!(damaged.kind(), ErrorKind::Corrupt);
        assert!(damaged.to_string().contains("\"xyz\""), "{damaged}");
        let id = "ffffffffffffffffffffffffffffffff";
        assert_eq!(
            StoreId::stored("p.db", Some(id.into())).unwrap().as_str(),
            id
        );
    }
}
