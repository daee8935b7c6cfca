//! Validating newtypes for the protocol's identifiers and bounded integers.
//!
//! Each type can only be built through a constructor that checks its rule, so a
//! function that takes a [`Seq`] never needs to check for zero, and a function
//! that takes a [`FlowId`] never needs to check its characters.

use std::fmt;

/// The longest identifier, in characters.
pub const IDENTIFIER_LEN_MAX: usize = 100;

/// Why a value was refused by a validating constructor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{rule}")]
pub struct RuleViolation {
    /// The rule that was broken, in words meant for the person who sent the value.
    pub rule: String,
}

impl RuleViolation {
    fn new(rule: impl Into<String>) -> Self {
        RuleViolation { rule: rule.into() }
    }
}

/// `value` if it is 1 to 100 characters of `[A-Za-z0-9_-]`.
fn identifier(value: String) -> Result<String, RuleViolation> {
    const RULE: &str = "must be 1 to 100 characters of [A-Za-z0-9_-]";
    if value.is_empty() || value.len() > IDENTIFIER_LEN_MAX {
        return Err(RuleViolation::new(format!(
            "{RULE} (got {} characters)",
            value.chars().count()
        )));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(RuleViolation::new(format!("{RULE} (got {bad:?})")));
    }
    Ok(value)
}

/// A newtype over `String` that holds only text `$check` accepts
/// (`fn(String) -> Result<String, $err>`): its `new`, documented by the
/// caller, refuses the rest with `$check`'s error; `as_str`, `Display` and
/// `FromStr` go through the text.
macro_rules! checked_string {
    (
        $(#[$meta:meta])*
        pub struct $name:ident;
        $(#[$new_doc:meta])*
        new: $check:path => $err:ty;
    ) => {
        $(#[$meta])*
        pub struct $name(String);

        impl $name {
            $(#[$new_doc])*
            pub fn new(value: impl Into<String>) -> Result<Self, $err> {
                $check(value.into()).map($name)
            }

            #[doc = concat!("The `", stringify!($name), "` as text.")]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = $err;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::new(s)
            }
        }
    };
}

pub(crate) use checked_string;

checked_string! {
    /// Identifies a flow (an aggregate whose events are ordered by [`Seq`]).
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct FlowId;
    /// Builds the identifier, refusing anything but 1 to 100 characters of
    /// `[A-Za-z0-9_-]`.
    new: identifier => RuleViolation;
}

checked_string! {
    /// Identifies one event, globally within a producer namespace.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct EventId;
    /// Builds the identifier, refusing anything but 1 to 100 characters of
    /// `[A-Za-z0-9_-]`.
    new: identifier => RuleViolation;
}

/// `value` if it is in `1..=i64::MAX`.
fn positive(value: i64) -> Result<i64, RuleViolation> {
    if value >= 1 {
        Ok(value)
    } else {
        Err(RuleViolation::new(format!(
            "must be an integer in 1..={} (got {value})",
            i64::MAX
        )))
    }
}

/// A position in a flow's event sequence: `1..=i64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(i64);

impl Seq {
    /// The first position of every flow.
    pub const FIRST: Seq = Seq(1);

    /// Builds a seq, refusing anything outside `1..=i64::MAX`.
    pub fn new(value: i64) -> Result<Self, RuleViolation> {
        positive(value).map(Seq)
    }

    /// The position after `last`, where `last` is a flow's last committed seq
    /// (0 for a flow without events). `None` when that would pass `i64::MAX`:
    /// allocation never wraps.
    pub fn after(last: i64) -> Option<Seq> {
        debug_assert!(last >= 0, "a last seq is never negative");
        last.checked_add(1).map(Seq)
    }

    /// The seq as an integer.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A schema version of an event payload: `1..=i64::MAX`. Whether a consumer
/// understands a version is a semantic question decided at apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SchemaVersion(i64);

impl SchemaVersion {
    /// The first version of a payload schema.
    pub const V1: SchemaVersion = SchemaVersion(1);
    /// The second version of a payload schema.
    pub const V2: SchemaVersion = SchemaVersion(2);

    /// Builds a schema version, refusing anything outside `1..=i64::MAX`.
    pub fn new(value: i64) -> Result<Self, RuleViolation> {
        positive(value).map(SchemaVersion)
    }

    /// The version as an integer.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for SchemaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl EventId {
    /// The event id ordo gives to `(flow_id, seq)` when the producer does
    /// not bring its own: `FLOW-SEQ` when that fits in 100 characters, else
    /// `h` followed by the SHA-256 of `FLOW\nSEQ` in hex. Both forms are
    /// deterministic, so a flow's history has the same ids whichever process
    /// committed it, and two flows never share an id.
    pub fn for_seq(flow_id: &FlowId, seq: Seq) -> EventId {
        let readable = format!("{flow_id}-{seq}");
        let id = if readable.len() <= IDENTIFIER_LEN_MAX {
            readable
        } else {
            let hash = crate::envelope::BodyHash::of(&format!("{flow_id}\n{seq}"));
            format!("h{hash}")
        };
        EventId::new(id).expect("both event id forms are identifiers")
    }
}

/// The longest block code, in characters.
pub const BLOCK_CODE_LEN_MAX: usize = 64;

/// Why a handler blocked an event, as a short code chosen by the handler:
/// 1 to 64 characters of `[a-z0-9_]` (`invalid_payload`, `unknown_type`, ...).
/// Stored beside the event and reported by `apply` and `inbox list`.
///
/// Fixed-size and `Copy`, so codes can be constants:
/// `const UNKNOWN_TYPE: BlockCode = BlockCode::from_static("unknown_type");`
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockCode {
    bytes: [u8; BLOCK_CODE_LEN_MAX],
    len: u8,
}

impl BlockCode {
    /// Builds a code, refusing anything but 1 to 64 characters of `[a-z0-9_]`.
    pub fn new(value: &str) -> Result<BlockCode, RuleViolation> {
        BlockCode::build(value.as_bytes()).ok_or_else(|| {
            RuleViolation::new(format!(
                "a block code must be 1 to {BLOCK_CODE_LEN_MAX} characters of [a-z0-9_] (got {value:?})"
            ))
        })
    }

    /// Builds a code from a constant; a code breaking the rule fails to
    /// compile when used in a `const`, and panics otherwise.
    pub const fn from_static(value: &'static str) -> BlockCode {
        match BlockCode::build(value.as_bytes()) {
            Some(code) => code,
            None => panic!("a block code must be 1 to 64 characters of [a-z0-9_]"),
        }
    }

    const fn build(value: &[u8]) -> Option<BlockCode> {
        if value.is_empty() || value.len() > BLOCK_CODE_LEN_MAX {
            return None;
        }
        let mut bytes = [0u8; BLOCK_CODE_LEN_MAX];
        let mut i = 0;
        while i < value.len() {
            let b = value[i];
            if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
                return None;
            }
            bytes[i] = b;
            i += 1;
        }
        Some(BlockCode {
            bytes,
            len: value.len() as u8,
        })
    }

    /// The code as text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).expect("a block code is ASCII")
    }
}

impl fmt::Debug for BlockCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockCode({:?})", self.as_str())
    }
}

impl fmt::Display for BlockCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BlockCode {
    type Err = RuleViolation;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BlockCode::new(s)
    }
}

/// The longest domain name, in characters.
pub const DOMAIN_NAME_LEN_MAX: usize = 64;

checked_string! {
    /// The name of the domain (the application's flow type and handler) that
    /// owns a store: `[a-z][a-z0-9_-]{0,63}`. Every store records it, so that a
    /// handler never runs on another application's events.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct DomainName;
    /// Builds a domain name, refusing anything but `[a-z][a-z0-9_-]{0,63}`.
    new: domain_name => RuleViolation;
}

checked_string! {
    /// The name of a producer store (PROTOCOL.md section 12):
    /// `[a-z][a-z0-9_-]{0,63}`, set when the store is created and never
    /// changed; [`ProducerName::DEFAULT`] when none is given and for every
    /// store of an earlier release. It names the producer's namespace in
    /// every inbox it delivers to.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct ProducerName;
    /// Builds a producer name, refusing anything but `[a-z][a-z0-9_-]{0,63}`.
    new: producer_name => RuleViolation;
}

impl ProducerName {
    /// The name of a producer store created without one, and of every store
    /// of an earlier release.
    pub const DEFAULT: &'static str = "default";

    /// [`ProducerName::DEFAULT`] as a name.
    pub fn default_name() -> ProducerName {
        ProducerName(ProducerName::DEFAULT.to_string())
    }

    /// The greatest name there is (64 `z`s): no name sorts after it, so a
    /// range read past `(flow_id, last_name())` starts at the next flow id.
    pub fn last_name() -> ProducerName {
        ProducerName("z".repeat(64))
    }

    /// Whether this is [`ProducerName::DEFAULT`] (left out of the envelopes
    /// its store appends).
    pub fn is_default(&self) -> bool {
        self.0 == ProducerName::DEFAULT
    }
}

impl Default for ProducerName {
    fn default() -> ProducerName {
        ProducerName::default_name()
    }
}

/// A flow of the inbox (PROTOCOL.md section 12): a flow id in the namespace
/// of the producer that appended it. Each `(producer, flow_id)` is its own
/// flow for ordering, gaps, blocking, skip and prune. Ordered by flow id,
/// then producer, so that a store fed by one producer lists its flows as
/// before.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InboxFlow {
    /// The flow id, as the producer gave it.
    pub flow_id: FlowId,
    /// The producer whose namespace it is in.
    pub producer: ProducerName,
}

impl InboxFlow {
    /// The flow `flow_id` of `producer`.
    pub fn new(producer: ProducerName, flow_id: FlowId) -> InboxFlow {
        InboxFlow { flow_id, producer }
    }

    /// The flow `flow_id` of the default producer.
    pub fn of_default(flow_id: FlowId) -> InboxFlow {
        InboxFlow::new(ProducerName::default_name(), flow_id)
    }
}

/// `o-1` for the default producer's flow, `o-1 of producer orders` for
/// another's.
impl fmt::Display for InboxFlow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.producer.is_default() {
            write!(f, "{}", self.flow_id)
        } else {
            write!(f, "{} of producer {}", self.flow_id, self.producer)
        }
    }
}

checked_string! {
    /// The name of one of a producer store's destinations (PROTOCOL.md
    /// section 12): `[a-z][a-z0-9_-]{0,63}`, as producer names;
    /// [`DestinationName::DEFAULT`] is the one every new store starts with
    /// and the one every store of an earlier release has.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct DestinationName;
    /// Builds a destination name, refusing anything but `[a-z][a-z0-9_-]{0,63}`.
    new: destination_name => RuleViolation;
}

impl DestinationName {
    /// The destination of a new store, and the one of every store of an
    /// earlier release.
    pub const DEFAULT: &'static str = "default";

    /// [`DestinationName::DEFAULT`] as a name.
    pub fn default_name() -> DestinationName {
        DestinationName(DestinationName::DEFAULT.to_string())
    }
}

/// `value` if it is a destination name: `[a-z][a-z0-9_-]{0,63}`.
fn destination_name(value: String) -> Result<String, RuleViolation> {
    lower_name("destination name", value)
}

/// `value` if it is a domain name: `[a-z][a-z0-9_-]{0,63}`.
fn domain_name(value: String) -> Result<String, RuleViolation> {
    lower_name("domain name", value)
}

/// `value` if it is a producer name: `[a-z][a-z0-9_-]{0,63}`.
fn producer_name(value: String) -> Result<String, RuleViolation> {
    lower_name("producer name", value)
}

/// `value` if it matches `[a-z][a-z0-9_-]{0,63}`; `what` names it in the
/// refusal.
fn lower_name(what: &str, value: String) -> Result<String, RuleViolation> {
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok =
        chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if first_ok && rest_ok && value.len() <= DOMAIN_NAME_LEN_MAX {
        Ok(value)
    } else {
        Err(RuleViolation::new(format!(
            "a {what} must match [a-z][a-z0-9_-]{{0,63}} (got {value:?})"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `new` builds a value of each of `good`, which shows as
    /// that text, and refuses each of `bad`.
    fn assert_rule<T: fmt::Display, E>(
        what: &str,
        new: impl Fn(&str) -> Result<T, E>,
        good: &[&str],
        bad: &[&str],
    ) {
        for value in good {
            let built = new(value).unwrap_or_else(|_| panic!("{what} {value:?} is refused"));
            assert_eq!(built.to_string(), *value, "{what} {value:?}");
        }
        for value in bad {
            assert!(new(value).is_err(), "{what} {value:?} is accepted");
        }
    }

    #[test]
    fn identifier_bounds() {
        let (longest, too_long) = ("x".repeat(100), "x".repeat(101));
        let good = ["a", "A-z_09", &longest];
        let bad = [&too_long, "", "a b", "a.b", "a/b", "é", "flow\n", "üüüüü"];
        assert_rule("flow id", |v| FlowId::new(v), &good, &bad);
        assert_rule("event id", |v| EventId::new(v), &good, &bad);
    }

    #[test]
    fn seq_bounds() {
        assert!(Seq::new(0).is_err());
        assert!(Seq::new(-1).is_err());
        assert_eq!(Seq::new(1).unwrap(), Seq::FIRST);
        assert_eq!(Seq::new(i64::MAX).unwrap().get(), i64::MAX);
        assert_eq!(Seq::after(0), Some(Seq::FIRST));
        assert_eq!(Seq::after(i64::MAX - 1).map(Seq::get), Some(i64::MAX));
        assert_eq!(Seq::after(i64::MAX), None);
    }

    #[test]
    fn block_code_bounds() {
        let (longest, too_long) = ("x".repeat(64), "x".repeat(65));
        let good = ["a", "invalid_payload", "x9_", &longest];
        let bad = [&too_long, "", "Upper", "has-dash", "sp ace", "é"];
        assert_rule("block code", BlockCode::new, &good, &bad);
        const C: BlockCode = BlockCode::from_static("unknown_type");
        assert_eq!(C, BlockCode::new("unknown_type").unwrap());
    }

    #[test]
    fn domain_name_bounds() {
        let longest = format!("a{}", "b".repeat(63));
        let too_long = format!("a{}", "b".repeat(64));
        let good = ["reservation", "orders-v2_x", "a", &longest];
        let bad = [&too_long, "", "1abc", "-a", "Orders", "a.b"];
        assert_rule("domain", |v| DomainName::new(v), &good, &bad);
        assert_rule("producer", |v| ProducerName::new(v), &good, &bad);
        let refused = ProducerName::new("Orders").unwrap_err().to_string();
        assert!(refused.contains("a producer name must match"), "{refused}");
        assert!(ProducerName::default().is_default());
        assert!(!ProducerName::new("orders").unwrap().is_default());
    }

    #[test]
    fn event_ids_for_seqs() {
        let flow = FlowId::new("order-7").unwrap();
        assert_eq!(EventId::for_seq(&flow, Seq::FIRST).as_str(), "order-7-1");
        let long = FlowId::new("f".repeat(100)).unwrap();
        let id = EventId::for_seq(&long, Seq::new(i64::MAX).unwrap());
        assert!(
            id.as_str().starts_with('h') && id.as_str().len() == 65,
            "{id}"
        );
        assert_ne!(id, EventId::for_seq(&long, Seq::FIRST));
    }

    #[test]
    fn schema_version_bounds() {
        assert!(SchemaVersion::new(0).is_err());
        assert_eq!(SchemaVersion::new(1).unwrap(), SchemaVersion::V1);
        assert_eq!(SchemaVersion::new(i64::MAX).unwrap().get(), i64::MAX);
    }
}
