//! The store traits' implementations that only pass a call on to a
//! backend's own function, written once for every backend.
//!
//! A backend keeps the protocol's SQL in functions of its own modules, one
//! per trait method and named after it, each taking the store first (or,
//! for the browse reads, the store's connection). These macros write the
//! trait implementations that call them, so that a trait method added here
//! is added to every backend in one place, and a backend that lacks the
//! function does not compile.
//!
//! Invariant: nothing here knows SQL or a backend's types beyond the names
//! passed in; the macros only forward.

/// Implements [`Receive`](crate::Receive), [`ConsumerOps`](crate::ConsumerOps)
/// and [`ConsumerStore`](crate::ConsumerStore) for a backend's consumer store
/// `$store` (with `conn` and `store_id` fields and an inherent `domain()`),
/// by calling:
/// `$inbox(&conn)`; `$receive::receive_answers(store, sender, ..)`;
/// `$ops::{inbox_entries, reopen_blocked, skip, repairs, consumer_status,
/// prune_inbox}(store, ..)`; `$browse::{consumer_flows_page,
/// inbox_entry_at, inbox_entry_of_event}(&conn, ..)`; `$apply::{pending_flows, reevaluated_flows}(store,
/// ..)` (merged by [`WorkPage`](crate::store::WorkPage)); and for the apply steps, the store's
/// [`ApplyStore`](crate::apply::ApplyStore) through
/// [`apply::next_in`](crate::apply::next_in) and
/// [`apply::batch_in`](crate::apply::batch_in).
#[macro_export]
macro_rules! consumer_store_impls {
    (
        store: $store:ty, tx: $tx:ty, inbox: $inbox:path,
        receive: $receive:ident, ops: $ops:ident, browse: $browse:ident, apply: $apply:ident $(,)?
    ) => {
        impl $crate::Receive for $store {
            fn receive_from(
                &mut self,
                sender: Option<&$crate::StoreId>,
                envelopes: &[$crate::Envelope],
            ) -> Result<Vec<$crate::Answer>, $crate::StoreError> {
                $receive::receive_answers(self, sender, envelopes)
            }
        }

        impl $crate::ConsumerOps for $store {
            fn domain(&self) -> &str {
                <$store>::domain(self)
            }

            fn store_id(&self) -> &$crate::StoreId {
                &self.store_id
            }

            fn inbox(&mut self) -> Result<Vec<$crate::InboxRecord>, $crate::StoreError> {
                $inbox(&self.conn)
            }

            fn inbox_entries(
                &mut self,
                blocked_only: bool,
                scope: $crate::ops::InboxScope<'_>,
                limit: usize,
            ) -> Result<Vec<$crate::ops::InboxEntry>, $crate::StoreError> {
                $ops::inbox_entries(self, blocked_only, scope, limit)
            }

            fn reopen_blocked(
                &mut self,
                flow: &$crate::InboxFlow,
            ) -> Result<u64, $crate::StoreError> {
                $ops::reopen_blocked(self, flow)
            }

            fn skip(
                &mut self,
                request: &$crate::ops::SkipRequest,
            ) -> Result<
                Result<$crate::ops::RepairRecord, $crate::ops::SkipRefused>,
                $crate::StoreError,
            > {
                $ops::skip(self, request)
            }

            fn repairs(&mut self) -> Result<Vec<$crate::ops::RepairRecord>, $crate::StoreError> {
                $ops::repairs(self)
            }

            fn consumer_status(
                &mut self,
            ) -> Result<$crate::ops::ConsumerStatus, $crate::StoreError> {
                $ops::consumer_status(self)
            }

            fn prune_inbox(
                &mut self,
                cutoff_ms: i64,
            ) -> Result<$crate::ops::Pruned, $crate::StoreError> {
                $ops::prune_inbox(self, cutoff_ms)
            }

            fn consumer_flows_page(
                &mut self,
                prefix: &str,
                after: Option<&$crate::InboxFlow>,
                limit: usize,
            ) -> Result<Vec<$crate::ops::ConsumerFlow>, $crate::StoreError> {
                let page = $crate::store::FlowsPage {
                    prefix,
                    after: after.map(|f| &f.flow_id),
                    after_producer: after.map_or("", |f| f.producer.as_str()),
                    limit,
                };
                page.consumer_flows($browse::consumer_flows_page(&self.conn, page)?)
            }

            fn inbox_entry_at(
                &mut self,
                flow: &$crate::InboxFlow,
                seq: $crate::Seq,
            ) -> Result<Option<$crate::ops::InboxEntry>, $crate::StoreError> {
                $browse::inbox_entry_at(&self.conn, flow, seq)
            }

            fn inbox_entry_of_event(
                &mut self,
                producer: &$crate::ProducerName,
                event_id: &$crate::EventId,
            ) -> Result<Option<$crate::ops::InboxEntry>, $crate::StoreError> {
                $browse::inbox_entry_of_event(&self.conn, producer, event_id)
            }
        }

        impl $crate::ConsumerStore for $store {
            type Tx = $tx;

            fn apply_next_with<H>(
                &mut self,
                flow: &$crate::InboxFlow,
                handler: &mut H,
            ) -> Result<$crate::Step, $crate::StoreError>
            where
                H: $crate::ApplyHandler<$tx> + ?Sized,
            {
                $crate::apply::next_in(self, flow, handler)
            }

            fn apply_batch_with<H>(
                &mut self,
                flows: &[($crate::InboxFlow, Option<u64>)],
                events_max: u64,
                handler: &mut H,
            ) -> Result<Vec<$crate::Drain>, $crate::StoreError>
            where
                H: $crate::ApplyHandler<$tx> + ?Sized,
            {
                $crate::apply::batch_in(self, flows, events_max, handler)
            }

            fn flows_with_work_page(
                &mut self,
                after: Option<&$crate::InboxFlow>,
                limit: usize,
                reevaluate: &[$crate::BlockCode],
            ) -> Result<Vec<$crate::InboxFlow>, $crate::StoreError> {
                let page = $crate::store::WorkPage::new(after, limit);
                let pending = $apply::pending_flows(self, page)?;
                let blocked = match reevaluate {
                    [] => Vec::new(),
                    codes => $apply::reevaluated_flows(self, page, codes)?,
                };
                Ok(page.merged(pending, blocked))
            }
        }
    };
}

/// The methods of [`ProducerOps`](crate::ProducerOps) that only forward,
/// written inside a backend's `impl ProducerOps` block (for a store with
/// `conn`, `store_id` and `producer_name` fields and an inherent
/// `domain()`): `domain`, `store_id`, `producer_name`, and the two browse
/// reads, which call
/// `$browse::{flows_page (with `PRODUCER_FLOWS_SQL`),
/// flow_outbox_entries}(&conn, ..)`.
#[macro_export]
macro_rules! producer_ops_methods {
    ($store:ty, $browse:ident) => {
        fn domain(&self) -> &str {
            <$store>::domain(self)
        }

        fn store_id(&self) -> &$crate::StoreId {
            &self.store_id
        }

        fn producer_name(&self) -> &$crate::ProducerName {
            &self.producer_name
        }

        fn producer_flows_page(
            &mut self,
            prefix: &str,
            after: Option<&$crate::FlowId>,
            limit: usize,
        ) -> Result<Vec<$crate::ops::ProducerFlow>, $crate::StoreError> {
            let page = $crate::store::FlowsPage {
                prefix,
                after,
                after_producer: "",
                limit,
            };
            page.producer_flows($browse::flows_page(
                &self.conn,
                $crate::Role::Producer,
                $browse::PRODUCER_FLOWS_SQL,
                page,
            )?)
        }

        fn flow_outbox_entries(
            &mut self,
            flow_id: &$crate::FlowId,
            limit: usize,
        ) -> Result<Vec<$crate::ops::OutboxEntry>, $crate::StoreError> {
            $browse::flow_outbox_entries(&self.conn, flow_id, limit)
        }
    };
}

/// Implements [`RunStore`](crate::RunStore) for `$store` (with a `clock`
/// field): its signal is `$signal` and its cross-process check
/// `$changed`, each an expression over the store bound to `$s`.
#[macro_export]
macro_rules! run_store_impl {
    ($store:ty, |$s:ident| signal: $signal:expr, changed_elsewhere: $changed:expr $(,)?) => {
        impl $crate::RunStore for $store {
            fn clock(&self) -> std::sync::Arc<dyn $crate::Clock> {
                self.clock.clone()
            }

            fn signal(&self) -> $crate::Signal {
                let $s = self;
                $signal
            }

            fn changed_elsewhere(&mut self) -> Result<bool, $crate::StoreError> {
                let $s = self;
                $changed
            }
        }
    };
}
