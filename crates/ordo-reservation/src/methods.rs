//! The methods of [`ReservationProducer`](crate::ReservationProducer) and
//! [`ReservationConsumer`](crate::ReservationConsumer) that read the same
//! on every store: only the store's transaction types differ, so each
//! backend's `impl` expands them here instead of writing them again.

/// `advance` and `advance_batch` over the store's `write`, with the crash
/// points around the commit; `$one` advances one request in the
/// transaction, `$all` a batch of them; `flows` reads the flow table with
/// `$flows` on the store's connection.
macro_rules! advance_methods {
    ($one:path, $all:path, $flows:path) => {
        fn flows(&mut self) -> Result<Vec<FlowRecord>, StoreError> {
            $flows(self.connection())
        }

        fn advance(&mut self, request: &AdvanceRequest) -> Result<Advance, AdvanceError> {
            let outcome = self.write(|ptx| -> Result<Advance, AdvanceError> {
                let outcome = $one(ptx, request)??;
                if matches!(outcome, Advance::Committed(_)) {
                    crash::point(crash::PRODUCER_ADVANCE_BEFORE_COMMIT);
                }
                Ok(outcome)
            })?;
            if matches!(outcome, Advance::Committed(_)) {
                crash::point(crash::PRODUCER_ADVANCE_AFTER_COMMIT);
            }
            Ok(outcome)
        }

        fn advance_batch(
            &mut self,
            requests: &[AdvanceRequest],
        ) -> Result<Vec<Result<Advance, AdvanceRefused>>, StoreError> {
            let committed = |outcomes: &[Result<Advance, AdvanceRefused>]| {
                outcomes
                    .iter()
                    .any(|o| matches!(o, Ok(Advance::Committed(_))))
            };
            let outcomes = self
                .write(|ptx| -> Result<Vec<_>, AdvanceError> {
                    let outcomes = $all(ptx, requests)?;
                    if committed(&outcomes) {
                        crash::point(crash::PRODUCER_ADVANCE_BEFORE_COMMIT);
                    }
                    Ok(outcomes)
                })
                .map_err(|e| match e {
                    AdvanceError::Store(e) => e,
                    AdvanceError::Refused(r) => {
                        unreachable!("a batch returns refusals as values: {r}")
                    }
                })?;
            if committed(&outcomes) {
                crash::point(crash::PRODUCER_ADVANCE_AFTER_COMMIT);
            }
            Ok(outcomes)
        }
    };
}

/// The apply methods, each the store's own with a
/// [`ReservationHandler`](crate::ReservationHandler) of the given options,
/// and the reads of the consumer's tables on the store's connection
/// (`$projections`, `$projection` of one flow, `$effects`).
macro_rules! apply_methods {
    ($projections:path, $projection:path, $effects:path) => {
        fn projections(&mut self) -> Result<Vec<Projection>, StoreError> {
            $projections(self.connection())
        }

        fn projection(&mut self, flow: &ordo_core::InboxFlow) -> Result<Projection, StoreError> {
            $projection(self.connection(), flow)
        }

        fn effects(&mut self) -> Result<Vec<EffectRecord>, StoreError> {
            $effects(self.connection())
        }

        fn apply_next(
            &mut self,
            flow: &ordo_core::InboxFlow,
            options: ApplyOptions,
        ) -> Result<Step, StoreError> {
            self.apply_next_with(flow, &mut ReservationHandler::new(options))
        }

        fn apply_batch(
            &mut self,
            flows: &[(ordo_core::InboxFlow, Option<u64>)],
            events_max: u64,
            options: ApplyOptions,
        ) -> Result<Vec<Drain>, StoreError> {
            self.apply_batch_with(flows, events_max, &mut ReservationHandler::new(options))
        }

        fn drain(
            &mut self,
            flow: &ordo_core::InboxFlow,
            limit: Option<u64>,
            options: ApplyOptions,
            batch_len_max: u64,
        ) -> Result<Drain, StoreError> {
            let mut handler = ReservationHandler::new(options);
            ordo_core::drain(self, flow, limit, &mut handler, batch_len_max)
        }

        fn process_all(
            &mut self,
            limit: Option<u64>,
            options: ApplyOptions,
            batch_len_max: u64,
        ) -> Result<Vec<Drain>, StoreError> {
            let mut handler = ReservationHandler::new(options);
            ordo_core::process_all(self, limit, &mut handler, batch_len_max)
        }

        fn flows_with_reservation_work(
            &mut self,
            options: ApplyOptions,
        ) -> Result<Vec<ordo_core::InboxFlow>, StoreError> {
            let handler = ReservationHandler::new(options);
            self.flows_with_work(handler.reevaluate())
        }
    };
}

pub(crate) use {advance_methods, apply_methods};
