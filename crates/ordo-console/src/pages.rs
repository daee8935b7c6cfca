//! The pages, rendered with maud: every interpolated value is escaped, so
//! an event id or a payload holding markup shows as text. No inline script
//! or style: the console's own script and stylesheet are static files.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::StatusCode;
use axum::response::Html;
use maud::{html, Markup, DOCTYPE};
use ordo_core::destination::Custody;
use ordo_core::ops::{InboxEntry, OutboxEntry, RepairRecord};
use ordo_core::{DestinationName, Envelope, FlowId, InboxFlow};
use serde_json::Value;

use crate::{Blocked, Console, FlowDetail, FlowRow, Overview, Quarantined, SkipPreview, ROWS_MAX};

/// A rendered page and its status.
pub type Page = (StatusCode, Html<String>);

fn layout(title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · ordo console" }
                    link rel="stylesheet" href="/static/console.css";
                    script src="/static/console.js" defer {}
                }
                body {
                    header {
                        a.brand href="/" { "ordo console" }
                        a href="/flows" { "Flows" }
                        a href="/quarantined" { "Quarantined" }
                        a href="/blocked" { "Blocked" }
                        a href="/effects" { "Effects" }
                        a href="/repairs" { "Repair log" }
                    }
                    main {
                        h1 { (title) }
                        (body)
                    }
                }
            }
        }
        .into_string(),
    )
}

pub(crate) fn ok(title: &str, body: Markup) -> Page {
    (StatusCode::OK, layout(title, body))
}

/// A page of `status` telling what went wrong.
fn error(status: StatusCode, title: &str, message: &str) -> Page {
    (status, layout(title, html! { p.error { (message) } }))
}

/// A store failure.
pub fn failure(message: &str) -> Page {
    error(StatusCode::INTERNAL_SERVER_ERROR, "Error", message)
}

/// An action refused before anything is written.
pub fn forbidden(message: &str) -> Page {
    error(StatusCode::FORBIDDEN, "Refused", message)
}

/// An action the store refused; nothing was written.
pub fn conflict(message: &str) -> Page {
    error(StatusCode::CONFLICT, "Refused", message)
}

/// An action done.
pub fn done(message: &str) -> Page {
    ok(
        "Done",
        html! { p id="done" { (message) } p { a href="/" { "Back to the overview" } } },
    )
}

/// A request the console cannot serve.
pub fn bad_request(message: &str) -> Page {
    error(StatusCode::BAD_REQUEST, "Bad request", message)
}

/// The login form; `error` tells why the last attempt failed.
pub fn login(token_required: bool, error: Option<&str>) -> Html<String> {
    layout(
        "Log in",
        html! {
            @if let Some(error) = error { p.error { (error) } }
            @if token_required {
                form method="post" action="/login" {
                    label { "Operator token " input type="password" name="token" autocomplete="current-password" autofocus; }
                    " "
                    button type="submit" { "Log in" }
                }
            } @else {
                p { "This console asks for no token (it listens on loopback only). " a href="/" { "Go to the overview" } }
            }
        },
    )
}

fn ms(at_ms: Option<i64>) -> String {
    at_ms.map(|t| t.to_string()).unwrap_or_default()
}

fn flow_link(flow_id: &FlowId) -> Markup {
    html! { a href={ "/flow?id=" (urlencode(flow_id.as_str())) } { (flow_id.as_str()) } }
}

/// The query of an inbox flow's pages: its id, and its producer unless
/// the default.
fn flow_query(flow: &InboxFlow) -> String {
    let id = urlencode(flow.flow_id.as_str());
    match flow.producer.is_default() {
        true => format!("id={id}"),
        false => format!("id={id}&producer={}", urlencode(flow.producer.as_str())),
    }
}

/// A link to an inbox flow's page, named as it is shown (`o-1 of
/// producer orders` for another producer's).
fn inbox_flow_link(flow: &InboxFlow) -> Markup {
    html! { a href={ "/flow?" (flow_query(flow)) } { (flow.to_string()) } }
}

/// Percent-encodes a query parameter's value.
pub(crate) fn urlencode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

const METRIC_LABELS: [(&str, &str); 8] = [
    ("backlog", "Backlog (events not yet accepted)"),
    ("oldest_pending_age_s", "Oldest pending age (s)"),
    ("quarantined", "Quarantined"),
    ("rewound", "Of those, rewound producer"),
    ("blocked", "Blocked rows"),
    ("gaps_total", "Flows waiting on a gap"),
    ("applied", "Applied"),
    ("skipped", "Skipped"),
];

pub fn overview(console: &Console, overview: &Overview) -> Page {
    let metrics = overview.metrics();
    ok(
        "Overview",
        html! {
            p.note {
                "Producer: " (if console.producer.is_some() { "given" } else { "not given" })
                " · consumer: " (if console.consumer.is_some() { "given" } else { "not given" })
                " · read at " (overview.now_ms) " ms"
                @if console.read_only { " · read-only" }
            }
            div.metrics {
                @for (name, label) in METRIC_LABELS {
                    div.metric {
                        span.value data-metric=(name) { (metrics.get(name).map(String::as_str).unwrap_or("")) }
                        span.label { (label) }
                    }
                }
            }
            @if let Some(consumer) = &overview.consumer {
                @if !consumer.gaps.is_empty() {
                    h2 { "Flows waiting on a gap" }
                    table {
                        tr { th { "Flow" } th { "Missing seq" } th { "Waiting since (ms)" } th { "Waiting (s)" } }
                        @for gap in &consumer.gaps {
                            tr {
                                td { (inbox_flow_link(&InboxFlow::new(gap.producer.clone(), gap.flow_id.clone()))) }
                                td { (gap.missing.get()) }
                                td { (gap.since_ms) }
                                td { (Value::from(ordo_core::ops::age_s(overview.now_ms, gap.since_ms))) }
                            }
                        }
                    }
                }
                @if !consumer.blocked.is_empty() {
                    h2 { "Blocked rows by reason" }
                    table {
                        tr { th { "Reason" } th { "Rows" } }
                        @for (reason, count) in &consumer.blocked {
                            tr { td { (reason) } td { (count) } }
                        }
                    }
                }
            }
        },
    )
}

pub fn flows(prefix: &str, rows: &[FlowRow], next: Option<&FlowId>) -> Page {
    ok(
        "Flows",
        html! {
            form.search method="get" action="/flows" {
                label { "Flow id starts with " input type="text" name="q" value=(prefix); }
                " "
                button type="submit" { "Search" }
            }
            @if rows.is_empty() {
                p.note { "No flow." }
            } @else {
                table id="flows" {
                    tr { th { "Flow" } th { "Producer's last seq" } th { "Consumer's applied seq" } }
                    @for row in rows {
                        tr data-flow=(row.flow.flow_id.as_str()) {
                            td { (inbox_flow_link(&row.flow)) }
                            td { (row.last_seq.map(|s| s.to_string()).unwrap_or_default()) }
                            td { (row.applied_seq.map(|s| s.to_string()).unwrap_or_default()) }
                        }
                    }
                }
            }
            @if let Some(next) = next {
                a id="next" href={ "/flows?q=" (urlencode(prefix)) "&after=" (urlencode(next.as_str())) } { "Next page" }
            }
        },
    )
}

/// A flow's outbox rows: with one destination, its bookkeeping in columns
/// of their own, as ever; with more, [`outbox_by_destination`].
fn outbox_table(rows: &[OutboxEntry], destinations: &[DestinationName]) -> Markup {
    if destinations.len() > 1 {
        return outbox_by_destination(rows, destinations);
    }
    html! {
        table {
            tr {
                th { "Seq" } th { "Event id" } th { "Type" } th { "Created (ms)" } th { "Accepted (ms)" }
                th { "Quarantined" } th { "Attempts" } th { "Last outcome" } th { "Last error" } th { "Next attempt (ms)" } th { "Payload" }
            }
            @for row in rows {
                tr {
                    td { (row.envelope.seq.get()) }
                    td { (row.envelope.event_id.as_str()) }
                    td { (row.envelope.event_type.as_str()) }
                    td { (row.created_at_ms) }
                    td { (ms(row.accepted_at_ms)) }
                    td { @if row.quarantined { "yes: " (row.quarantine_reason.as_deref().unwrap_or("")) } }
                    td { (row.attempts) }
                    td { (row.last_outcome.as_deref().unwrap_or("")) }
                    td { (row.last_error.as_deref().unwrap_or("")) }
                    td { (row.next_attempt_at_ms) }
                    td { pre { (Value::Object(row.envelope.payload.clone())) } }
                }
            }
        }
    }
}

/// A flow's outbox rows on a store of several destinations: whether every
/// destination of the flow holds each one, and a column per destination
/// with its marks of the row.
fn outbox_by_destination(rows: &[OutboxEntry], destinations: &[DestinationName]) -> Markup {
    html! {
        table.by-destination {
            tr {
                th { "Seq" } th { "Event id" } th { "Type" } th { "Created (ms)" } th { "Accepted everywhere (ms)" }
                @for name in destinations { th { "At " (name.as_str()) } }
                th { "Payload" }
            }
            @for row in rows {
                tr {
                    td { (row.envelope.seq.get()) }
                    td { (row.envelope.event_id.as_str()) }
                    td { (row.envelope.event_type.as_str()) }
                    td { (row.created_at_ms) }
                    td { (ms(row.accepted_at_ms)) }
                    @for name in destinations {
                        @match row.destinations.iter().find(|c| &c.destination == name) {
                            Some(custody) => td data-destination=(name.as_str()) data-mark=(mark(custody)) { (marks(custody)) },
                            None => td data-destination=(name.as_str()) data-mark="not-delivered" { "not delivered here" },
                        }
                    }
                    td { pre { (Value::Object(row.envelope.payload.clone())) } }
                }
            }
        }
    }
}

/// Where a row stands at one destination: `accepted`, `abandoned`,
/// `quarantined` or `pending`.
fn mark(custody: &Custody) -> &'static str {
    if custody.accepted {
        "accepted"
    } else if custody.abandoned {
        "abandoned"
    } else if custody.quarantined {
        "quarantined"
    } else {
        "pending"
    }
}

/// One destination's marks of a row: where it stands (a quarantine with
/// its reason and text), its attempts, its last outcome and error, and
/// the next attempt of a row still pending there.
fn marks(c: &Custody) -> Markup {
    let mark = mark(c);
    html! {
        (mark)
        @if let Some(at) = c.accepted_at_ms { " at " (at) }
        @if c.quarantined {
            ": " (c.quarantine_reason.as_deref().unwrap_or(""))
            @if let Some(detail) = &c.quarantine_detail { " (" (detail) ")" }
        }
        " · attempts " (c.attempts)
        @if let Some(outcome) = &c.last_outcome { " · last " (outcome) }
        @if let Some(error) = &c.last_error { " · error " (error) }
        @if mark == "pending" && c.next_attempt_at_ms > 0 { " · next attempt (ms) " (c.next_attempt_at_ms) }
    }
}

fn inbox_table(rows: &[InboxEntry]) -> Markup {
    html! {
        table {
            tr {
                th { "Flow" } th { "Seq" } th { "Event id" } th { "Type" } th { "Status" } th { "Reason" } th { "Detail" }
                th { "Received (ms)" } th { "Settled (ms)" } th { "Payload" }
            }
            @for row in rows {
                tr {
                    td { (inbox_flow_link(&row.envelope.inbox_flow())) }
                    td { (row.envelope.seq.get()) }
                    td { (row.envelope.event_id.as_str()) }
                    td { (row.envelope.event_type.as_str()) }
                    td { (row.status.as_str()) }
                    td { (row.status.reason().map(|r| r.code.as_str()).unwrap_or("")) }
                    td { (row.status.reason().and_then(|r| r.detail.as_deref()).unwrap_or("")) }
                    td { (row.received_at_ms) }
                    td { (ms(row.settled_at_ms)) }
                    td { pre { (Value::Object(row.envelope.payload.clone())) } }
                }
            }
        }
    }
}

pub(crate) fn truncated(len: usize) -> Markup {
    html! { @if len >= ROWS_MAX { p.note { "Only the first " (ROWS_MAX) " rows are shown." } } }
}

pub fn flow(console: &Console, detail: &FlowDetail) -> Page {
    ok(
        &format!("Flow {}", detail.flow),
        html! {
            @if let Some(applied) = detail.applied_seq {
                p { "Consumer's applied seq: " span id="applied-seq" { (applied) } }
                @if !console.read_only {
                    p { a href={ "/flow/skip?" (flow_query(&detail.flow)) } { "Skip the flow's next event…" } }
                }
            }
            @if let Some(missing) = detail.gap() {
                p.error id="gap" { "Waiting on a gap: seq " (missing) " is missing while a later one is stored." }
            }
            @if let Some(outbox) = &detail.outbox {
                h2 { "Outbox" }
                @if outbox.is_empty() { p.note { "No outbox row (none written, or all pruned)." } }
                @else { (outbox_table(outbox, &detail.destinations)) (truncated(outbox.len())) }
            }
            @if let Some(inbox) = &detail.inbox {
                h2 { "Inbox" }
                @if inbox.is_empty() { p.note { "No inbox row (none received, or all pruned)." } }
                @else { (inbox_table(inbox)) (truncated(inbox.len())) }
                h2 { "Domain state" }
                @match &detail.summary {
                    Some(fields) => {
                        table #summary {
                            @for (name, value) in fields {
                                tr { th { (name) } td data-field=(name) { (value) } }
                            }
                        }
                    }
                    None => {
                        p.note #summary { "This store's domain keeps the flow's state in the application's own tables: the application shows it." }
                    }
                }
            }
        },
    )
}

/// The top-level fields of an envelope: its identities, then each payload
/// field as `payload.NAME`.
fn fields(envelope: &Envelope) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    out.insert("event_id".into(), Value::from(envelope.event_id.as_str()));
    out.insert("flow_id".into(), Value::from(envelope.flow_id.as_str()));
    out.insert("seq".into(), Value::from(envelope.seq.get()));
    out.insert(
        "schema_version".into(),
        Value::from(envelope.schema_version.get()),
    );
    out.insert("type".into(), Value::from(envelope.event_type.as_str()));
    for (name, value) in &envelope.payload {
        out.insert(format!("payload.{name}"), value.clone());
    }
    out
}

fn side_by_side(outbox: &Envelope, stored: &Envelope) -> Markup {
    let left = fields(outbox);
    let right = fields(stored);
    let names: BTreeSet<&String> = left.keys().chain(right.keys()).collect();
    html! {
        table.compare {
            tr { th { "Field" } th { "Outbox body" } th { "Consumer's stored body" } }
            @for name in names {
                @let (a, b) = (left.get(name), right.get(name));
                tr class=[(a != b).then_some("differs")] {
                    td.field { (name) }
                    td { pre { (a.map(Value::to_string).unwrap_or_default()) } }
                    td { pre { (b.map(Value::to_string).unwrap_or_default()) } }
                }
            }
        }
    }
}

/// The retry of `entry`'s quarantine: one form, or on a flow delivered to
/// several destinations one per destination that quarantined it.
fn retry_form(console: &Console, entry: &ordo_core::ops::OutboxEntry) -> Markup {
    let event_id = entry.envelope.event_id.as_str();
    let several = entry.destinations.len() > 1;
    let at: Vec<Option<&str>> = match several {
        false => vec![None],
        true => (entry.destinations.iter())
            .filter(|c| c.quarantined)
            .map(|c| Some(c.destination.as_str()))
            .collect(),
    };
    html! {
        @if !console.read_only {
            @for destination in at {
                form.action method="post" action="/quarantined/retry" {
                    input type="hidden" name="event_id" value=(event_id);
                    @if let Some(name) = destination {
                        input type="hidden" name="destination" value=(name);
                    }
                    input type="hidden" name="csrf" value=(console.csrf.as_str());
                    button type="submit" {
                        "Retry once more"
                        @if let Some(name) = destination { " at " (name) }
                    }
                    " (as " code {
                        "ordo outbox retry"
                        @if let Some(name) = destination { " --destination " (name) }
                    }
                    "; fix the cause first, or the consumer answers conflict again)"
                }
            }
        }
    }
}

pub fn quarantined(console: &Console, rows: Option<&[Quarantined]>) -> Page {
    ok(
        "Quarantined events",
        html! {
            @match rows {
                None => p.note { "No producer store given: quarantined events are the producer's." },
                Some([]) => p.note { "No quarantined event." },
                Some(rows) => {
                    (truncated(rows.len()))
                    @for row in rows {
                        @let env = &row.outbox.envelope;
                        section.quarantined data-event=(env.event_id.as_str()) {
                            h2 { "Event " (env.event_id.as_str()) " (flow " (flow_link(&env.flow_id)) ", seq " (env.seq.get()) ")" }
                            p { "Reason: " (row.outbox.quarantine_reason.as_deref().unwrap_or("")) " · attempts " (row.outbox.attempts) }
                            @if row.outbox.destinations.len() > 1 {
                                ul.destinations {
                                    @for custody in &row.outbox.destinations {
                                        li data-destination=(custody.destination.as_str()) data-mark=(mark(custody)) {
                                            "At " (custody.destination.as_str()) ": " (marks(custody))
                                        }
                                    }
                                }
                            }
                            (retry_form(console, &row.outbox))
                            @match &row.stored {
                                None => {
                                    p.note { "No consumer store given: the outbox body alone." }
                                    pre { (env.body()) }
                                }
                                Some(None) => {
                                    p.note { "The consumer stores nothing at this flow and seq, nor under this event id (a pruned row keeps only its fingerprint)." }
                                    pre { (env.body()) }
                                }
                                Some(Some(stored)) => {
                                    @if row.by_event_id {
                                        @let at = &stored.envelope;
                                        p.stored-at { "The conflict is on the event id: the consumer stores it at flow " (flow_link(&at.flow_id)) ", seq " (at.seq.get()) "." }
                                    }
                                    (side_by_side(env, &stored.envelope))
                                    table {
                                        tr { th { "Outbox body" } th { "Consumer's stored body" } }
                                        tr { td { pre { (env.body()) } } td { pre { (stored.envelope.body()) } } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

fn reevaluate_forms(console: &Console, rows: &[InboxEntry]) -> Markup {
    let flows: BTreeSet<InboxFlow> = rows.iter().map(|r| r.envelope.inbox_flow()).collect();
    html! {
        @if console.read_only {
        } @else if console.reevaluate.is_some() {
            @for flow in flows {
                form.action method="post" action="/blocked/reevaluate" {
                    input type="hidden" name="flow_id" value=(flow.flow_id.as_str());
                    input type="hidden" name="producer" value=(flow.producer.as_str());
                    input type="hidden" name="csrf" value=(console.csrf.as_str());
                    button type="submit" { "Re-evaluate flow " (flow.to_string()) }
                    " " label { input type="checkbox" name="support_v2"; " with schema 2 support" }
                    " (as " code { "ordo inbox retry" } ")"
                }
            }
        } @else {
            p.note { "The application's handler re-evaluates the rows blocked with the codes it lists (ApplyHandler::reevaluate); ConsumerOps::reopen_blocked reopens a flow's rows from the application." }
        }
    }
}

pub fn blocked(console: &Console, blocked: Option<&Blocked>) -> Page {
    ok(
        "Blocked events",
        html! {
            @match blocked {
                None => p.note { "No consumer store given: blocked rows are the consumer's." },
                Some(blocked) if blocked.totals.is_empty() => p.note { "No blocked row." },
                Some(blocked) => {
                    @for (code, total) in &blocked.totals {
                        section.reason data-reason=(code) {
                            h2 { (code) " (" (total) ")" }
                            @if let Some(rows) = blocked.rows.get(code) {
                                (inbox_table(rows))
                                (reevaluate_forms(console, rows))
                            }
                        }
                    }
                    (truncated(blocked.rows.values().map(Vec::len).sum()))
                }
            }
        },
    )
}

pub fn repairs(log: Option<&[RepairRecord]>) -> Page {
    ok(
        "Repair log",
        html! {
            @match log {
                None => p.note { "No consumer store given: the repair log is the consumer's." },
                Some([]) => p.note { "No repair yet." },
                Some(log) => table {
                    tr { th { "#" } th { "At (ms)" } th { "Action" } th { "Flow" } th { "Seq" } th { "Event id" } th { "By" } th { "Reason" } }
                    @for r in log {
                        tr {
                            td { (r.id) } td { (r.at_ms) } td { (r.action) } td { (flow_link(&r.flow_id)) }
                            td { (r.seq.get()) } td { (r.event_id.as_str()) } td { (r.by) } td { (r.reason) }
                        }
                    }
                }
            }
        },
    )
}

pub fn skip_preview(console: &Console, preview: &SkipPreview, confirm: Option<&str>) -> Page {
    let flow = preview.flow.flow_id.as_str();
    let shown = preview.flow.to_string();
    let next_seq = preview.applied_seq + 1;
    ok(
        &format!("Skip the next event of flow {shown}"),
        html! {
            @match (&preview.next, confirm) {
                (Some(next), Some(confirm)) => {
                    p { "Skipping changes exactly this, in one transaction:" }
                    ul id="preview" {
                        li { "the inbox row of flow " (inbox_flow_link(&preview.flow)) " seq " (next_seq)
                             " (event " (next.envelope.event_id.as_str()) ", type " (next.envelope.event_type.as_str())
                             ", now " (next.status.as_str()) ") becomes " code { "skipped" } ": its effect is never applied;" }
                        li { "the flow's applied seq moves from " (preview.applied_seq) " to " (next_seq) ", so apply goes on with seq " (next_seq + 1) ";" }
                        li { "a record of who, when and why is appended to the repair log." }
                    }
                    p { "No body changes. The payload of the row skipped:" }
                    pre { (Value::Object(next.envelope.payload.clone())) }
                    form.action method="post" action="/flow/skip" {
                        input type="hidden" name="flow_id" value=(flow);
                        input type="hidden" name="producer" value=(preview.flow.producer.as_str());
                        input type="hidden" name="seq" value=(next_seq);
                        input type="hidden" name="csrf" value=(console.csrf.as_str());
                        input type="hidden" name="confirm" value=(confirm);
                        p { label { "Operator name " input type="text" name="by" required maxlength="100"; } }
                        p { label { "Reason " input type="text" name="reason" required maxlength="1000"; } }
                        button type="submit" { "Skip seq " (next_seq) }
                    }
                }
                _ => p.note { "Nothing to skip: flow " (flow) " stores nothing at its next seq " (next_seq) " (a missing event cannot be skipped; it may still arrive)." }
            }
        },
    )
}
