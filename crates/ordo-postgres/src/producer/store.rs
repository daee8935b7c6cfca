//! The producer store's side of the protocol: the relay's rounds and
//! bookkeeping, repairs, status and pruning over the outbox.

use super::*;
use crate::browse;
use ordo_core::destination::{
    AbandonRequest, Destination, DestinationRefused, DestinationStart, ProducerRepair,
};
use ordo_core::store::sql_limit;
use ordo_core::{DestinationName, ProducerOps, StoreId};

impl ProducerOps for PgProducer {
    fn outbox(&mut self) -> Result<Vec<OutboxRecord>, StoreError> {
        read_outbox(&self.conn)
    }

    fn outbox_event(&mut self, event_id: &EventId) -> Result<Option<OutboxRecord>, StoreError> {
        let rows = self.conn.rows(
            "producer: cannot read the outbox",
            concat!(
                "SELECT body, ",
                held_everywhere_sql!(),
                " FROM {s}.outbox o WHERE event_id = $1"
            ),
            &[&event_id.as_str()],
        )?;
        Ok(outbox_records(rows)?.pop())
    }

    fn outbox_entries(
        &mut self,
        quarantined_only: bool,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let rows = self.conn.rows(
            "producer: cannot list the outbox",
            "SELECT position, body, created_at_ms, accepted FROM {s}.outbox o
             WHERE (NOT $1 OR EXISTS (SELECT 1 FROM {s}.custody c
                 WHERE c.position = o.position AND c.quarantined))
             ORDER BY position LIMIT $2",
            &[&quarantined_only, &sql_limit(limit)],
        )?;
        outbox_entries_of(&self.conn, &rows)
    }

    fn retry_quarantined(
        &mut self,
        event_id: &EventId,
    ) -> Result<Result<(), RetryRefused>, StoreError> {
        let destination = self.destination_id()?;
        self.write(|ptx| {
            let context = "producer: cannot retry a quarantined event";
            let row = ptx.conn.row(
                context,
                "SELECT o.flow_id, o.seq, c.quarantined, o.position FROM {s}.outbox o
                 LEFT JOIN {s}.custody c ON c.position = o.position AND c.destination = $2
                 WHERE o.event_id = $1 FOR UPDATE OF o",
                &[&event_id.as_str(), &destination],
            )?;
            let (flow, seq, position) = match row {
                None => return Ok(Err(RetryRefused::Unknown(event_id.clone()))),
                Some(row) if row.get::<_, Option<bool>>(2) != Some(true) => {
                    return Ok(Err(RetryRefused::NotQuarantined(event_id.clone())))
                }
                Some(row) => (
                    row.get::<_, String>(0),
                    row.get::<_, i64>(1),
                    row.get::<_, i64>(3),
                ),
            };
            ptx.conn.run(
                context,
                "UPDATE {s}.custody SET quarantined = false, quarantine_reason = NULL,
                     quarantine_detail = NULL, next_attempt_at_ms = 0
                 WHERE position = $1 AND destination = $2",
                &[&position, &destination],
            )?;
            // A retried rewound event lifts its flow's stop.
            ptx.conn.run(
                context,
                "UPDATE {s}.relay_head SET relay_stop_seq = NULL
                 WHERE flow_id = $1 AND destination = $3 AND relay_stop_seq = $2",
                &[&flow, &seq, &destination],
            )?;
            let flows = BTreeSet::from([flow]);
            ptx.conn.control(context, KEY_ORDER)?;
            refresh_heads(ptx.conn, (destination, &flows), Turn::Keep, Some(seq))?;
            Ok(Ok(()))
        })
    }

    fn producer_status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError> {
        let destinations = custody::destinations(&self.conn, now_ms)?;
        Ok(ordo_core::destination::sum_statuses(
            destinations.iter().map(|d| &d.status),
        ))
    }

    fn prune_outbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        self.write(|ptx| {
            let row = ptx.conn.row(
                "producer: cannot prune the outbox",
                "WITH gone AS (
                     DELETE FROM {s}.outbox WHERE accepted AND accepted_at_ms < $1
                     RETURNING position),
                 marks AS (
                     DELETE FROM {s}.custody c
                     WHERE c.position = ANY (ARRAY(SELECT position FROM gone)))
                 SELECT count(*) FROM gone",
                &[&cutoff_ms],
            )?;
            let rows = row.expect("an aggregate returns one row").get::<_, i64>(0);
            Ok(Pruned {
                rows: rows.max(0) as u64,
                fingerprints: 0,
            })
        })
    }

    fn destinations(&mut self, now_ms: i64) -> Result<Vec<Destination>, StoreError> {
        custody::destinations(&self.conn, now_ms)
    }

    fn add_destination(
        &mut self,
        name: &DestinationName,
        from: DestinationStart,
    ) -> Result<Result<(), DestinationRefused>, StoreError> {
        self.write(|ptx| custody::add(ptx.conn, name, from, ptx.now_ms))
    }

    fn remove_destination(
        &mut self,
        name: &DestinationName,
        by: &str,
        reason: &str,
    ) -> Result<Result<(), DestinationRefused>, StoreError> {
        let removed =
            self.write(|ptx| custody::remove(ptx.conn, name, (by, reason), ptx.now_ms))?;
        Ok(removed.map(|id| {
            if self.destination == Some(id) {
                self.destination = None;
            }
        }))
    }

    fn abandon_flow(
        &mut self,
        request: &AbandonRequest,
    ) -> Result<Result<ProducerRepair, DestinationRefused>, StoreError> {
        self.write(|ptx| custody::abandon(ptx.conn, request, ptx.now_ms))
    }

    fn producer_repairs(&mut self) -> Result<Vec<ProducerRepair>, StoreError> {
        custody::repairs(&self.conn)
    }

    /// Choosing another destination than the one the handle served first
    /// releases the leases it holds there.
    fn use_destination(
        &mut self,
        name: Option<&DestinationName>,
    ) -> Result<Result<(), DestinationRefused>, StoreError> {
        let chosen = match custody::choose(&self.conn, name)? {
            Ok(id) => id,
            Err(refused) => return Ok(Err(refused)),
        };
        if self.destination.is_some_and(|id| id != chosen) && self.may_hold() {
            self.release_leases()?;
        }
        self.destination = Some(chosen);
        Ok(Ok(()))
    }

    ordo_core::producer_ops_methods!(PgProducer, browse);
}

impl ProducerStore for PgProducer {
    fn append_events(&mut self, events: &[Envelope]) -> Result<(), AppendError> {
        self.write(|ptx| ptx.append_envelopes(events))
    }

    fn pending(&mut self, limit: usize) -> Result<Vec<Envelope>, StoreError> {
        let destination = self.destination_id()?;
        envelopes(self.conn.rows(
            "producer: cannot read pending events",
            PENDING_SQL,
            &[&sql_limit(limit), &destination],
        )?)
    }

    fn oldest_unaccepted(&mut self, now_ms: i64) -> Result<Option<Envelope>, StoreError> {
        let destination = self.destination_id()?;
        let row = self.conn.row(
            "producer: cannot read the oldest unaccepted event",
            PENDING_SQL,
            &[&1i64, &destination],
        )?;
        match row {
            Some(row) if row.get::<_, i64>(1) <= now_ms => {
                Ok(Some(stored_envelope(BODY, row.get(0))?))
            }
            _ => Ok(None),
        }
    }

    /// Claims the flows of the round first (see [`PgProducer`]): only the
    /// events of flows this handle holds are returned. Claims about as many
    /// flows as the round's events need, at the events per flow of this
    /// handle's last round (one before its first).
    fn fair_round_deep(
        &mut self,
        limit: usize,
        flow_events_max: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError> {
        let per_flow = self.events_per_flow.clamp(1, flow_events_max.max(1));
        let flows_max = limit.div_ceil(per_flow).max(1);
        let skip: Vec<&str> = skip.iter().map(FlowId::as_str).collect();
        let flows_sql = i64::try_from(flows_max).unwrap_or(i64::MAX);
        self.held = self.claim(flows_sql, &skip, now_ms)?;
        if self.held.is_empty() {
            return Ok(Vec::new());
        }
        let flows: Vec<&str> = self.held.keys().map(String::as_str).collect();
        let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
        let depth_sql = i64::try_from(flow_events_max.max(1)).unwrap_or(i64::MAX);
        let destination = self.destination.expect("the claim chose the destination");
        let round = envelopes(self.conn.rows(
            "producer: cannot pick a fair round",
            ROUND_SQL,
            &[&now_ms, &limit_sql, &flows, &depth_sql, &destination],
        )?)?;
        let served: HashSet<&str> = round.iter().map(|e| e.flow_id.as_str()).collect();
        self.events_per_flow = round.len().checked_div(served.len()).unwrap_or(1);
        if round.len() < limit {
            let idle: BTreeSet<String> = (self.held.keys())
                .filter(|flow| !served.contains(flow.as_str()))
                .cloned()
                .collect();
            self.refresh_idle_heads(&idle)?;
        }
        Ok(round)
    }

    /// Committed without waiting for the WAL flush: an accepted mark lost
    /// with the server only makes the relay hand the event over again, and
    /// the consumer answers duplicate. Refused whole ([`ErrorKind::LeaseLost`])
    /// when another relay claimed one of the events' flows since this
    /// handle's round.
    fn record_receipts(
        &mut self,
        receipts: &[(EventId, Receipt)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.record_receipts_from(None, receipts, now_ms)
    }

    /// Read once per destination that recorded one: a handle remembers it
    /// (a recorded identity is never rewritten).
    fn recorded_consumer(&mut self) -> Result<Option<StoreId>, StoreError> {
        let destination = self.destination_id()?;
        if let Some((id, recorded)) = &self.consumer_recorded {
            if *id == destination {
                return Ok(Some(recorded.clone()));
            }
        }
        let recorded = custody::destination_consumer(&self.conn, destination)?.1;
        if let Some(recorded) = &recorded {
            self.consumer_recorded = Some((destination, recorded.clone()));
        }
        Ok(recorded)
    }

    fn check_consumer(&mut self, consumer: &StoreId) -> Result<(), StoreError> {
        if self.recorded_consumer()?.as_ref() == Some(consumer) {
            return Ok(());
        }
        let destination = self.destination_id()?;
        custody::checked_consumer(&self.conn, destination, consumer).map(drop)
    }

    /// Records the consumer store `consumer` of the destination at its
    /// first delivery from a known one, in the transaction of the marks,
    /// and refuses receipts from another one afterwards, nothing marked
    /// (PROTOCOL.md section 12).
    fn record_receipts_from(
        &mut self,
        consumer: Option<&StoreId>,
        receipts: &[(EventId, Receipt)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let ids: Vec<&str> = receipts.iter().map(|(id, _)| id.as_str()).collect();
        let fences = if receipts.iter().any(|(_, r)| r.quarantine().is_some()) {
            Fences::Locked
        } else {
            Fences::Seen
        };
        self.bookkeeping(&ids, fences, |tx, destination, store_now_ms| {
            custody::check_consumer(tx, destination, consumer)?;
            record_receipts_in(tx, destination, receipts, store_now_ms.max(now_ms))
        })
    }

    /// Refused whole ([`ErrorKind::LeaseLost`]) when another relay claimed
    /// one of the events' flows since this handle's round.
    fn record_failure(
        &mut self,
        event_ids: &[EventId],
        error: &str,
        now_ms: i64,
        backoff: &Backoff,
    ) -> Result<(), StoreError> {
        let ids: Vec<&str> = event_ids.iter().map(EventId::as_str).collect();
        self.bookkeeping(&ids, Fences::Locked, |tx, destination, _| {
            let mut flows = BTreeSet::new();
            for event_id in event_ids {
                let row = tx.row(
                    "producer: cannot record a delivery failure",
                    "UPDATE {s}.custody c SET attempts = c.attempts + 1, last_outcome = 'error',
                         last_error = $2
                     FROM {s}.outbox o
                     WHERE o.event_id = $1 AND c.position = o.position AND c.destination = $3
                       AND NOT c.accepted
                     RETURNING o.flow_id, c.attempts, c.position",
                    &[&event_id.as_str(), &error, &destination],
                )?;
                let Some(row) = row else { continue };
                let attempts: i64 = row.get(1);
                let delay_ms =
                    backoff.delay_ms(u32::try_from(attempts).unwrap_or(u32::MAX), fastrand::f64());
                // Strictly later than the failure, whatever the jitter drew.
                let due = now_ms
                    .saturating_add(1)
                    .saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
                tx.run(
                    "producer: cannot record a delivery failure",
                    "UPDATE {s}.custody SET next_attempt_at_ms = $2
                     WHERE position = $1 AND destination = $3",
                    &[&row.get::<_, i64>(2), &due, &destination],
                )?;
                flows.insert(row.get::<_, String>(0));
            }
            refresh_heads(tx, (destination, &flows), Turn::Keep, None)
        })
    }

    /// Refused ([`ErrorKind::LeaseLost`]) when another relay claimed the
    /// event's flow since this handle's round.
    fn quarantine(
        &mut self,
        event_id: &EventId,
        outcome: &str,
        reason: &str,
        _now_ms: i64,
    ) -> Result<(), StoreError> {
        self.bookkeeping(
            &[event_id.as_str()],
            Fences::Locked,
            |tx, destination, _| {
                let row = tx.row(
                    "producer: cannot quarantine an event",
                    "UPDATE {s}.custody c SET quarantined = true, quarantine_reason = $3,
                     quarantine_detail = $2, attempts = c.attempts + 1, last_outcome = $3,
                     last_error = $2
                 FROM {s}.outbox o
                 WHERE o.event_id = $1 AND c.position = o.position AND c.destination = $4
                   AND NOT c.accepted AND NOT c.abandoned
                 RETURNING o.flow_id",
                    &[&event_id.as_str(), &reason, &outcome, &destination],
                )?;
                let flows = row.map(|row| row.get::<_, String>(0)).into_iter().collect();
                refresh_heads(tx, (destination, &flows), Turn::Keep, None)
            },
        )
    }
}

/// `accepted_at` is the later of the relay's clock and the store's. The
/// latest receipt of each event is recorded, every event in one statement
/// (arrays as parameters), and the flows' heads moved in two more.
fn record_receipts_in(
    conn: &PgTx,
    destination: i64,
    receipts: &[(EventId, Receipt)],
    accepted_at: i64,
) -> Result<(), StoreError> {
    let context = "producer: cannot record receipts";
    let mut latest: BTreeMap<&str, Receipt> = BTreeMap::new();
    for (event_id, receipt) in receipts {
        latest.insert(event_id.as_str(), *receipt);
    }
    let (conflicts, stored): (Vec<_>, Vec<_>) = latest
        .into_iter()
        .partition(|(_, receipt)| receipt.quarantine().is_some());
    let mut flows = BTreeSet::new();
    // An event no longer in the outbox was settled and pruned meanwhile:
    // there is nothing left to mark.
    stop_rewound_flows(conn, destination, &conflicts)?;
    // One statement per cause (at most two), each naming its rows by key.
    for cause in [Receipt::Conflict, Receipt::ProducerRewound] {
        let ids: Vec<&str> = (conflicts.iter())
            .filter(|(_, receipt)| *receipt == cause)
            .map(|(id, _)| *id)
            .collect();
        let Some((outcome, reason)) = cause.quarantine().filter(|_| !ids.is_empty()) else {
            continue;
        };
        flows.extend(
            conn.rows(
                context,
                "UPDATE {s}.custody c SET quarantined = NOT c.accepted,
                     quarantine_reason = CASE WHEN c.accepted THEN NULL ELSE $3 END,
                     quarantine_detail = CASE WHEN c.accepted THEN NULL ELSE $2 END,
                     attempts = c.attempts + 1, last_outcome = $3
                 FROM {s}.outbox o
                 WHERE o.event_id = ANY (ARRAY(SELECT unnest($1::text[])))
                   AND c.position = o.position AND c.destination = $4 AND NOT c.abandoned
                 RETURNING o.flow_id",
                &[&ids, &reason, &outcome, &destination],
            )?
            .iter()
            .map(|row| row.get::<_, String>(0)),
        );
    }
    if !stored.is_empty() {
        let ids: Vec<&str> = stored.iter().map(|(id, _)| *id).collect();
        let outcomes: Vec<&str> = stored.iter().map(|(_, receipt)| receipt.as_str()).collect();
        flows.extend(
            conn.rows(
                context,
                MARK_ACCEPTED_SQL,
                &[&ids, &outcomes, &accepted_at, &destination],
            )?
            .iter()
            .map(|row| row.get::<_, String>(0)),
        );
    }
    refresh_heads(conn, (destination, &flows), Turn::Next, None)?;
    crash::point(crash::RELAY_MARK_BEFORE_COMMIT);
    Ok(())
}

/// Stops each flow of a `producer_rewound` receipt at its lowest such seq:
/// nothing of it from there on is relayed (a retry of that event lifts it).
fn stop_rewound_flows(
    conn: &PgTx,
    destination: i64,
    conflicts: &[(&str, Receipt)],
) -> Result<(), StoreError> {
    let ids: Vec<&str> = (conflicts.iter())
        .filter(|(_, receipt)| *receipt == Receipt::ProducerRewound)
        .map(|(id, _)| *id)
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    conn.run(
        "producer: cannot stop a rewound flow",
        "UPDATE {s}.relay_head h SET relay_stop_seq = least(h.relay_stop_seq, s.seq)
         FROM (SELECT flow_id, min(seq) AS seq FROM {s}.outbox
               WHERE event_id = ANY (ARRAY(SELECT unnest($1::text[]))) GROUP BY flow_id) AS s
         WHERE h.flow_id = s.flow_id AND h.destination = $2",
        &[&ids, &destination],
    )?;
    Ok(())
}
