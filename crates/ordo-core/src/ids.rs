//! Validating newtypes for the protocol's identifiers and bounded integers.
//!
//! Each type can only be built through a constructor that checks its rule, so a
//! function that takes a [`Seq`] never needs to check for zero, and a function
//! that takes a [`FlowId`] never needs to check its characters.

use std::fmt;

/// The longest identifier, in characters.
pub const IDENTIFIER_LEN_MAX: usize = 100;
/// The largest quantity a flow may carry.
pub const QUANTITY_MAX: i64 = 1_000_000;

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

fn check_identifier(value: &str) -> Result<(), RuleViolation> {
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
    Ok(())
}

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Builds the identifier, refusing anything but 1 to 100 characters of
            /// `[A-Za-z0-9_-]`.
            pub fn new(value: impl Into<String>) -> Result<Self, RuleViolation> {
                let value = value.into();
                check_identifier(&value)?;
                Ok($name(value))
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = RuleViolation;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::new(s)
            }
        }
    };
}

identifier!(
    /// Identifies a flow (an aggregate whose events are ordered by [`Seq`]).
    FlowId
);
identifier!(
    /// Identifies one event, globally within a producer namespace.
    EventId
);

/// A position in a flow's event sequence: `1..=i64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(i64);

impl Seq {
    /// The first position of every flow.
    pub const FIRST: Seq = Seq(1);

    /// Builds a seq, refusing anything outside `1..=i64::MAX`.
    pub fn new(value: i64) -> Result<Self, RuleViolation> {
        if value >= 1 {
            Ok(Seq(value))
        } else {
            Err(RuleViolation::new(format!(
                "must be an integer in 1..={} (got {value})",
                i64::MAX
            )))
        }
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
    /// Schema 1: payload `{"amount": q}`.
    pub const V1: SchemaVersion = SchemaVersion(1);
    /// Schema 2: payload `{"units": q}`.
    pub const V2: SchemaVersion = SchemaVersion(2);

    /// Builds a schema version, refusing anything outside `1..=i64::MAX`.
    pub fn new(value: i64) -> Result<Self, RuleViolation> {
        if value >= 1 {
            Ok(SchemaVersion(value))
        } else {
            Err(RuleViolation::new(format!(
                "must be an integer in 1..={} (got {value})",
                i64::MAX
            )))
        }
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

/// The fixed quantity a reservation flow carries: `1..=1_000_000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(i64);

impl Quantity {
    /// Builds a quantity, refusing anything outside `1..=1_000_000`.
    pub fn new(value: i64) -> Result<Self, RuleViolation> {
        if (1..=QUANTITY_MAX).contains(&value) {
            Ok(Quantity(value))
        } else {
            Err(RuleViolation::new(format!(
                "must be an integer in 1..={QUANTITY_MAX} (got {value})"
            )))
        }
    }

    /// The quantity as an integer.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_bounds() {
        let cases: &[(&str, bool)] = &[
            ("a", true),
            ("A-z_09", true),
            (&"x".repeat(100), true),
            (&"x".repeat(101), false),
            ("", false),
            ("a b", false),
            ("a.b", false),
            ("a/b", false),
            ("é", false),
            ("flow\n", false),
            ("üüüüü", false),
        ];
        for (value, ok) in cases {
            assert_eq!(FlowId::new(*value).is_ok(), *ok, "flow id {value:?}");
            assert_eq!(EventId::new(*value).is_ok(), *ok, "event id {value:?}");
        }
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
    fn quantity_bounds() {
        for (value, ok) in [
            (0, false),
            (1, true),
            (1_000_000, true),
            (1_000_001, false),
            (-5, false),
        ] {
            assert_eq!(Quantity::new(value).is_ok(), ok, "quantity {value}");
        }
    }

    #[test]
    fn schema_version_bounds() {
        assert!(SchemaVersion::new(0).is_err());
        assert_eq!(SchemaVersion::new(1).unwrap(), SchemaVersion::V1);
        assert_eq!(SchemaVersion::new(i64::MAX).unwrap().get(), i64::MAX);
    }
}
