//! What an open of a store asks for, the same on every backend.
//!
//! Invariant: nothing here knows where a store lives (a file, a server's
//! schema); a backend maps [`Want`] onto its own creation and migration.

use crate::domain::Schema;

/// What an open wants of the store it finds, or of the one it creates.
#[derive(Debug, Clone, Copy)]
pub enum Want<'a> {
    /// This domain's store: created for it if there is none, migrated to
    /// its schema; a store of another domain is refused.
    Domain(&'a Schema),
    /// An existing store of any domain, left as it is (no domain
    /// migration); nothing is created.
    Any,
    /// An existing store of any domain as with [`Want::Any`], or, when
    /// there is none, a new store of this domain.
    AnyOrNew(&'a Schema),
}

impl<'a> Want<'a> {
    /// The schema a missing (or empty) store is created with; `None`: it
    /// is not created.
    pub fn creates_with(self) -> Option<&'a Schema> {
        match self {
            Want::Domain(schema) | Want::AnyOrNew(schema) => Some(schema),
            Want::Any => None,
        }
    }

    /// The schema an existing store is migrated to and checked against;
    /// `None`: it is taken as it is, of whatever domain.
    pub fn migrates_with(self) -> Option<&'a Schema> {
        match self {
            Want::Domain(schema) => Some(schema),
            Want::Any | Want::AnyOrNew(_) => None,
        }
    }

    /// The schema that applies to a store found `empty` (none yet) or not.
    pub fn schema_for(self, empty: bool) -> Option<&'a Schema> {
        match empty {
            true => self.creates_with(),
            false => self.migrates_with(),
        }
    }
}

/// What one open of a store is given: the role's tables (`T`, the
/// backend's description of ordo's own tables), what it wants of the store
/// it finds, and the backend's open options (`O`).
#[derive(Debug)]
pub struct Opening<'a, T, O> {
    /// The tables of the store's role.
    pub tables: &'a T,
    /// What the open wants of the store.
    pub want: Want<'a>,
    /// The backend's options.
    pub options: &'a O,
}

impl<T, O> Clone for Opening<'_, T, O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T, O> Copy for Opening<'_, T, O> {}

/// The constructors of a backend's store of one role: `open_as(location,
/// want, clock, options)`, which hands `$tables` and the want to the
/// backend's `$open(location, opening)` and builds the store with its own
/// `from_opened(opened, clock, options)`, and through it `open`,
/// `open_with`, `open_existing` and `open_or_create`; and the accessors of
/// the store's `domain`, `clock` and `commits` fields. `$at: $location` is
/// the constructors' location parameter (a path, a URL), `$options` the
/// backend's open options.
#[macro_export]
macro_rules! open_constructors {
    ($store:ident, $at:ident: $location:ty, $options:ty, $tables:expr, $open:path) => {
        /// Opens the store at the location as `want` asks (what every
        /// constructor below calls).
        pub fn open_as(
            $at: $location,
            want: $crate::open::Want<'_>,
            clock: std::sync::Arc<dyn $crate::Clock>,
            options: &$options,
        ) -> Result<$store, $crate::StoreError> {
            let opening = $crate::open::Opening {
                tables: &$tables,
                want,
                options,
            };
            Ok($store::from_opened($open($at, opening)?, clock, options))
        }

        /// The domain that owns this store.
        pub fn domain(&self) -> &str {
            &self.domain
        }

        /// The clock this store stamps its writes with.
        pub fn clock(&self) -> std::sync::Arc<dyn $crate::Clock> {
            self.clock.clone()
        }

        /// How many write transactions this handle has committed.
        pub fn commits(&self) -> u64 {
            self.commits
        }

        /// Opens or creates the store of `schema`'s domain with the system
        /// clock and default options: ordo's tables and the domain's are
        /// created or migrated; existing state is never reset. A store of
        /// another domain is refused.
        pub fn open(
            $at: $location,
            schema: &$crate::domain::Schema,
        ) -> Result<$store, $crate::StoreError> {
            $store::open_with(
                $at,
                schema,
                std::sync::Arc::new($crate::SystemClock),
                &<$options>::default(),
            )
        }

        /// `open` with the given clock and options.
        pub fn open_with(
            $at: $location,
            schema: &$crate::domain::Schema,
            clock: std::sync::Arc<dyn $crate::Clock>,
            options: &$options,
        ) -> Result<$store, $crate::StoreError> {
            $store::open_as($at, $crate::open::Want::Domain(schema), clock, options)
        }

        /// Opens an existing store of this role of any domain, without
        /// running its domain's migrations: for what never runs the
        /// domain's handler or its rules (receive, relay, status, prune,
        /// listings, repairs). A missing store is refused and nothing is
        /// created.
        pub fn open_existing(
            $at: $location,
            clock: std::sync::Arc<dyn $crate::Clock>,
            options: &$options,
        ) -> Result<$store, $crate::StoreError> {
            $store::open_as($at, $crate::open::Want::Any, clock, options)
        }

        /// Opens an existing store of any domain as `open_existing` does,
        /// or, if there is none, creates a store of `schema`'s domain: what
        /// a command line that serves every domain, and creates stores of
        /// one, needs. Safe against racing processes.
        pub fn open_or_create(
            $at: $location,
            schema: &$crate::domain::Schema,
            clock: std::sync::Arc<dyn $crate::Clock>,
            options: &$options,
        ) -> Result<$store, $crate::StoreError> {
            $store::open_as($at, $crate::open::Want::AnyOrNew(schema), clock, options)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_want_creates_and_migrates_with_its_own_schema() {
        let schema = Schema::new("ledger").unwrap();
        let name = |s: Option<&Schema>| s.map(|s| s.domain().as_str().to_owned());
        let cases = [
            (Want::Domain(&schema), Some("ledger"), Some("ledger")),
            (Want::Any, None, None),
            (Want::AnyOrNew(&schema), Some("ledger"), None),
        ];
        for (want, creates, migrates) in cases {
            let (creates, migrates) = (creates.map(str::to_owned), migrates.map(str::to_owned));
            assert_eq!(name(want.creates_with()), creates, "{want:?}");
            assert_eq!(name(want.migrates_with()), migrates, "{want:?}");
            assert_eq!(name(want.schema_for(true)), creates, "{want:?}");
            assert_eq!(name(want.schema_for(false)), migrates, "{want:?}");
        }
    }
}
