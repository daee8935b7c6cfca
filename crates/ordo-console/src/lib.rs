//! The operator web console of ordo: server-rendered pages over a producer
//! store, a consumer store or both, showing what is stuck and why.
//!
//! Pages: the overview (the numbers of `ordo status`, each the text of an
//! element with a stable `data-metric` attribute, refreshed live by the
//! console's own script), the flows (searched by id prefix, keyset-paged),
//! one flow in detail, the quarantined events with both bodies side by
//! side, the blocked rows grouped by reason, and the repair log.
//!
//! Invariants: every value shown is escaped by the template engine; no
//! page carries an inline script or style, and every response carries a
//! Content-Security-Policy that forbids them, `X-Frame-Options: DENY` and
//! `X-Content-Type-Options: nosniff`. With an operator token, every page
//! but the login form and the static files needs the session cookie. The
//! console reads the stores only through `ordo-core`'s operator views
//! ([`ProducerOps`], [`ConsumerHandle`]), so any backend can stand behind it.

mod auth;
mod effects;
mod pages;
mod stores;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Form, Query, Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use ordo_core::ops::{ConsumerStatus, InboxScope, ProducerStatus};
use ordo_core::{
    Clock, ConsumerHandle, EventId, FlowId, InboxFlow, ProducerName, ProducerOps, StoreError,
};
use serde::Deserialize;

pub use auth::{Csrf, Token, TokenError, SESSION_MAX_AGE_S};
pub use effects::EffectConfirmations;
pub use stores::{keep_idle, ConsumerOpener, IdlePool, Kept, Lender, Opener, ProducerOpener};

/// The console's Content-Security-Policy: scripts, styles and everything
/// else from the console itself, no inline code, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The overview's numbers, by `data-metric` name, in display order.
pub const METRICS: [&str; 7] = [
    "backlog",
    "oldest_pending_age_s",
    "quarantined",
    "blocked",
    "gaps_total",
    "applied",
    "skipped",
];

/// Flows per page of the flow list.
pub const FLOWS_PER_PAGE: usize = 50;
/// The most rows one page lists of a flow, of the quarantined events, or of
/// the blocked rows.
pub const ROWS_MAX: usize = 1000;

/// What the console serves.
pub struct Console {
    /// The producer store, if given.
    pub producer: Option<Lender<dyn ProducerOps + Send>>,
    /// The consumer store, if given.
    pub consumer: Option<Lender<dyn ConsumerHandle>>,
    /// The clock of the ages shown (the same as `ordo status`'s).
    pub clock: Arc<dyn Clock>,
    /// The operator token; without one, no login is asked (loopback only,
    /// which the caller enforces).
    pub token: Option<Token>,
    /// Show no action, and refuse every action's POST.
    pub read_only: bool,
    /// The token of the action forms.
    pub csrf: Csrf,
    /// The one-time confirmations of the skips previewed, by token.
    pub confirmations: Confirmations,
    /// The one-time confirmations of the effect actions previewed.
    pub effect_confirmations: EffectConfirmations,
    /// Re-evaluates a flow's blocked rows through the domain's handler, if
    /// this process runs it (the reservation domain, as `ordo inbox
    /// retry`); other domains' handlers run in the application.
    pub reevaluate: Option<Reevaluator>,
    /// Reads a flow's state as the consumer's domain keeps it, if this
    /// process knows the domain (the reservation domain's projection);
    /// other domains keep theirs in the application's own tables.
    pub summary: Option<Summarizer>,
}

/// A flow's state as its domain keeps it, as `(name, value)` pairs in
/// display order.
pub type Summarizer =
    Arc<dyn Fn(&InboxFlow) -> Result<Vec<(String, String)>, StoreError> + Send + Sync>;

/// Re-evaluates a flow's blocked rows (`support_v2`: the reservation
/// domain's option); a line telling what happened, or why it failed.
pub type Reevaluator = Arc<dyn Fn(&InboxFlow, bool) -> Result<String, String> + Send + Sync>;

/// One-time confirmation tokens, each for the skip of one flow's one seq:
/// issued with a preview, used up by the first POST that returns it.
#[derive(Default)]
pub struct Confirmations(std::sync::Mutex<BTreeMap<String, (InboxFlow, ordo_core::Seq)>>);

/// The most confirmations kept; older ones are dropped beyond it.
const CONFIRMATIONS_MAX: usize = 1000;

impl Confirmations {
    fn issue(&self, flow: InboxFlow, seq: ordo_core::Seq) -> Option<String> {
        let token = Csrf::generate().ok()?.as_str().to_owned();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CONFIRMATIONS_MAX {
            map.clear();
        }
        map.insert(token.clone(), (flow, seq));
        Some(token)
    }

    /// Uses up `token`; whether it was issued for this flow and seq.
    fn redeem(&self, token: &str, flow: &InboxFlow, seq: ordo_core::Seq) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match map.remove(token) {
            Some((f, s)) => &f == flow && s == seq,
            None => false,
        }
    }
}

/// The router serving every page of `console`.
pub fn router(console: Console) -> Router {
    let app = Arc::new(console);
    Router::new()
        .route("/", get(overview_page))
        .route("/overview.json", get(overview_json))
        .route("/flows", get(flows_page))
        .route("/flow", get(flow_page))
        .route("/quarantined", get(quarantined_page))
        .route("/blocked", get(blocked_page))
        .route("/repairs", get(repairs_page))
        .route("/quarantined/retry", axum::routing::post(retry_quarantined))
        .route("/flow/skip", get(skip_preview).post(skip))
        .route("/blocked/reevaluate", axum::routing::post(reevaluate))
        .route("/effects", get(effects::effects_page))
        .route(
            "/effects/act",
            get(effects::effect_preview).post(effects::effect_act),
        )
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            require_session,
        ))
        .route("/login", get(login_form).post(login))
        .route("/static/console.js", get(script))
        .route("/static/console.css", get(stylesheet))
        .layer(middleware::from_fn(security_headers))
        .with_state(app)
}

type App = Arc<Console>;

/// Adds the security headers to every response.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it a browser sends `Origin: null` with the
    // console's own form POSTs, which the origin check must refuse. With
    // `same-origin`, nothing leaves for other sites and the console's own
    // forms carry their origin.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// With a token, a page needs the session cookie; without it the browser
/// is sent to the login form.
async fn require_session(State(app): State<App>, request: Request, next: Next) -> Response {
    match &app.token {
        Some(token) if !token.session_valid(request.headers(), app.clock.now_ms()) => {
            Redirect::to("/login").into_response()
        }
        _ => next.run(request).await,
    }
}

async fn login_form(State(app): State<App>) -> Response {
    pages::login(app.token.is_some(), None).into_response()
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

/// Checks the token (in constant time) and sets the session cookie. A
/// cross-site POST (its `Origin` naming another host) is refused.
async fn login(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let Some(token) = &app.token else {
        return Redirect::to("/").into_response();
    };
    if !auth::same_origin(&headers) {
        return (StatusCode::FORBIDDEN, "cross-origin request refused").into_response();
    }
    if !token.matches(form.token.trim()) {
        return (
            StatusCode::UNAUTHORIZED,
            pages::login(true, Some("wrong token")),
        )
            .into_response();
    }
    let mut response = Redirect::to("/").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&token.set_cookie(app.clock.now_ms())) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("static/console.js"),
    )
        .into_response()
}

async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("static/console.css"),
    )
        .into_response()
}

/// Runs a read on a blocking thread (never on the executor), turning a
/// store failure into an error page.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Response> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            tracing::warn!("console: {e}");
            Err(pages::failure(&e.to_string()).into_response())
        }
        Err(e) => Err(pages::failure(&format!("the read failed: {e}")).into_response()),
    }
}

/// Runs `read` on the console's stores on a blocking thread, then answers
/// with `answer` of what it read, or with the error page of its failure.
async fn read_then<T, R>(
    app: &App,
    read: impl FnOnce(&Console) -> Result<T, StoreError> + Send + 'static,
    answer: impl FnOnce(T) -> R,
) -> Response
where
    T: Send + 'static,
    R: IntoResponse,
{
    let read_app = Arc::clone(app);
    match blocking(move || read(&read_app)).await {
        Ok(value) => answer(value).into_response(),
        Err(response) => response,
    }
}

/// `call` on a handle of the store `side` lends; `None` when that store is
/// not given.
fn on_side<V: ?Sized + Send + 'static, T>(
    side: &Option<Lender<V>>,
    call: impl FnOnce(&mut V) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    match side {
        Some(open) => open()?.call(call).map(Some),
        None => Ok(None),
    }
}

/// A request's field as parsed, or the bad-request page naming it.
fn field<T, E: std::fmt::Display>(name: &str, parsed: Result<T, E>) -> Result<T, pages::Page> {
    parsed.map_err(|e| pages::bad_request(&format!("{name}: {e}")))
}

/// The consumer's applied seq of `flow` (0 before the first).
fn applied_seq(
    consumer: &mut Kept<dyn ConsumerHandle>,
    flow: &InboxFlow,
) -> Result<u64, StoreError> {
    // The page starts at the flow id itself (its prefix), its producers
    // first in `(flow_id, producer)` order.
    let page = consumer.call(|s| s.consumer_flows_page(flow.flow_id.as_str(), None, 64))?;
    Ok(page
        .into_iter()
        .find(|f| f.flow_id == flow.flow_id && f.producer == flow.producer)
        .map_or(0, |f| f.applied_seq))
}

/// Both sides' status, read at one clock reading.
pub struct Overview {
    /// The time the ages are computed at.
    pub now_ms: i64,
    /// The producer's signals, if a producer is given.
    pub producer: Option<ProducerStatus>,
    /// The consumer's signals, if a consumer is given.
    pub consumer: Option<ConsumerStatus>,
}

impl Overview {
    /// The text of each `data-metric` element: each value written as
    /// `ordo status --json` writes it; an absent value (a side not given,
    /// no pending event) is empty text.
    pub fn metrics(&self) -> BTreeMap<&'static str, String> {
        let number = |v: serde_json::Value| v.to_string();
        let p = self.producer.as_ref();
        let c = self.consumer.as_ref();
        let values: [(&'static str, Option<String>); 8] = [
            ("backlog", p.map(|p| number(p.backlog.into()))),
            (
                "oldest_pending_age_s",
                p.and_then(|p| p.oldest_pending_age_s(self.now_ms))
                    .map(|age| number(age.into())),
            ),
            ("quarantined", p.map(|p| number(p.quarantined.into()))),
            ("rewound", p.map(|p| number(p.rewound.into()))),
            ("blocked", c.map(|c| number(c.blocked_total().into()))),
            ("gaps_total", c.map(|c| number(c.gaps_total.into()))),
            ("applied", c.map(|c| number(c.applied.into()))),
            ("skipped", c.map(|c| number(c.skipped.into()))),
        ];
        values
            .into_iter()
            .map(|(name, value)| (name, value.unwrap_or_default()))
            .collect()
    }
}

fn read_overview(app: &Console) -> Result<Overview, StoreError> {
    let now_ms = app.clock.now_ms();
    Ok(Overview {
        now_ms,
        producer: on_side(&app.producer, |s| s.producer_status(now_ms))?,
        consumer: on_side(&app.consumer, |s| s.consumer_status())?,
    })
}

async fn overview_page(State(app): State<App>) -> Response {
    read_then(&app, read_overview, |overview| {
        pages::overview(&app, &overview)
    })
    .await
}

async fn overview_json(State(app): State<App>) -> Response {
    read_then(&app, read_overview, |overview| {
        (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&overview.metrics()).unwrap_or_default(),
        )
    })
    .await
}

#[derive(Deserialize, Default)]
struct FlowsQuery {
    #[serde(default)]
    q: String,
    after: Option<String>,
}

/// One row of the flow list: what each side knows of the flow.
pub struct FlowRow {
    /// The flow: its id, in the namespace of its producer (the producer
    /// store's own name on the producer's side).
    pub flow: InboxFlow,
    /// The producer's last committed seq, if the producer knows the flow.
    pub last_seq: Option<i64>,
    /// The consumer's applied seq, if the consumer knows the flow.
    pub applied_seq: Option<u64>,
}

/// The row of `flow`, added empty if neither side listed it yet.
fn flow_row(rows: &mut BTreeMap<InboxFlow, FlowRow>, flow: InboxFlow) -> &mut FlowRow {
    rows.entry(flow.clone()).or_insert(FlowRow {
        flow,
        last_seq: None,
        applied_seq: None,
    })
}

/// A page of flows from both sides, merged by flow id and producer; the
/// flow id to start the next page after, if there is one. A page ends
/// between flow ids (the producers of one flow id stay on one page),
/// unless one flow id fills it.
fn read_flows(
    app: &Console,
    prefix: &str,
    after: Option<&FlowId>,
) -> Result<(Vec<FlowRow>, Option<FlowId>), StoreError> {
    let mut rows: BTreeMap<InboxFlow, FlowRow> = BTreeMap::new();
    let fetch = FLOWS_PER_PAGE + 1;
    let produced = on_side(&app.producer, |s| {
        let flows = s.producer_flows_page(prefix, after, fetch)?;
        Ok((s.producer_name().clone(), flows))
    })?;
    for (name, flows) in produced.into_iter() {
        for flow in flows {
            let key = InboxFlow::new(name.clone(), flow.flow_id);
            flow_row(&mut rows, key).last_seq = Some(flow.last_seq.get());
        }
    }
    let consumed = on_side(&app.consumer, |s| {
        // Past every producer's flow `after`: the next page starts at the
        // next flow id.
        let after = after.map(|id| InboxFlow::new(ProducerName::last_name(), id.clone()));
        s.consumer_flows_page(prefix, after.as_ref(), fetch)
    })?;
    for flow in consumed.into_iter().flatten() {
        let key = InboxFlow::new(flow.producer, flow.flow_id);
        flow_row(&mut rows, key).applied_seq = Some(flow.applied_seq);
    }
    // Each side's first `fetch` flows are complete up to its own last; the
    // merged first FLOWS_PER_PAGE are then complete too.
    let mut rows: Vec<FlowRow> = rows.into_values().take(fetch).collect();
    if rows.len() <= FLOWS_PER_PAGE {
        return Ok((rows, None));
    }
    let cut = rows[FLOWS_PER_PAGE].flow.flow_id.clone();
    let whole = rows
        .iter()
        .take_while(|row| row.flow.flow_id != cut)
        .count();
    rows.truncate(if whole > 0 { whole } else { FLOWS_PER_PAGE });
    let next = rows.last().map(|row| row.flow.flow_id.clone());
    Ok((rows, next))
}

async fn flows_page(
    State(app): State<App>,
    Query(query): Query<FlowsQuery>,
) -> Result<Response, pages::Page> {
    let after = match query.after.as_deref().filter(|a| !a.is_empty()) {
        None => None,
        Some(after) => Some(field("after", FlowId::new(after))?),
    };
    let prefix = query.q.clone();
    Ok(read_then(
        &app,
        move |read| read_flows(read, &prefix, after.as_ref()),
        |(rows, next)| pages::flows(&query.q, &rows, next.as_ref()),
    )
    .await)
}

#[derive(Deserialize)]
struct FlowQuery {
    id: String,
    /// The producer whose flow `id` is, at the consumer (`default` if
    /// left out).
    #[serde(default)]
    producer: Option<String>,
}

impl FlowQuery {
    /// The inbox flow asked for, or the page that says why it is not one.
    fn flow(&self) -> Result<InboxFlow, pages::Page> {
        let flow_id = field("id", FlowId::new(&self.id))?;
        let producer = match self.producer.as_deref() {
            None | Some("") => ProducerName::default(),
            Some(name) => field("producer", ProducerName::new(name))?,
        };
        Ok(InboxFlow::new(producer, flow_id))
    }
}

/// Everything the console shows of one flow.
pub struct FlowDetail {
    /// The flow: its id, and at the consumer its producer.
    pub flow: InboxFlow,
    /// Its outbox rows, if a producer is given.
    pub outbox: Option<Vec<ordo_core::ops::OutboxEntry>>,
    /// The producer store's destinations, by name (none without a
    /// producer): with more than one, the outbox rows show each one's
    /// bookkeeping.
    pub destinations: Vec<ordo_core::DestinationName>,
    /// Its inbox rows, if a consumer is given.
    pub inbox: Option<Vec<ordo_core::ops::InboxEntry>>,
    /// The consumer's applied seq (0 before the first), if a consumer is
    /// given.
    pub applied_seq: Option<u64>,
    /// The flow's state as the consumer's domain keeps it, if the console
    /// knows the domain.
    pub summary: Option<Vec<(String, String)>>,
}

impl FlowDetail {
    /// The missing seq the flow waits on: nothing stored at the applied
    /// seq plus one while a later seq is stored.
    pub fn gap(&self) -> Option<u64> {
        let inbox = self.inbox.as_ref()?;
        let next = self.applied_seq? + 1;
        let seqs = || inbox.iter().map(|e| e.envelope.seq.get() as u64);
        let stored_next = seqs().any(|seq| seq == next);
        let later = seqs().any(|seq| seq > next);
        (!stored_next && later).then_some(next)
    }
}

fn read_flow(app: &Console, flow: InboxFlow) -> Result<FlowDetail, StoreError> {
    let flow_id = &flow.flow_id;
    let now_ms = app.clock.now_ms();
    let producer = on_side(&app.producer, |s| {
        let rows = s.flow_outbox_entries(flow_id, ROWS_MAX)?;
        let names = s.destinations(now_ms)?.into_iter().map(|d| d.name);
        Ok((rows, names.collect()))
    })?;
    let (outbox, destinations) = match producer {
        Some((rows, names)) => (Some(rows), names),
        None => (None, Vec::new()),
    };
    let (inbox, applied_seq) = match &app.consumer {
        Some(open) => {
            let mut consumer = open()?;
            let applied = applied_seq(&mut consumer, &flow)?;
            let scope = InboxScope::Flow(&flow);
            let rows = consumer.call(|s| s.inbox_entries(false, scope, ROWS_MAX))?;
            (Some(rows), Some(applied))
        }
        None => (None, None),
    };
    let summary = match &app.summary {
        Some(read) => Some(read(&flow)?),
        None => None,
    };
    Ok(FlowDetail {
        flow,
        outbox,
        destinations,
        inbox,
        applied_seq,
        summary,
    })
}

async fn flow_page(
    State(app): State<App>,
    Query(query): Query<FlowQuery>,
) -> Result<Response, pages::Page> {
    let flow = query.flow()?;
    Ok(read_then(
        &app,
        move |read| read_flow(read, flow),
        |detail| pages::flow(&app, &detail),
    )
    .await)
}

/// A quarantined outbox row and what the consumer stores at its flow and
/// seq, or else under its event id, if a consumer is given.
pub struct Quarantined {
    /// The outbox row.
    pub outbox: ordo_core::ops::OutboxEntry,
    /// The consumer's row at the same flow and seq, or else the one under
    /// the same event id: `None` without a consumer, `Some(None)` when it
    /// stores neither.
    pub stored: Option<Option<ordo_core::ops::InboxEntry>>,
    /// Whether `stored` was read by the event id, the consumer storing
    /// nothing at the flow and seq (the conflict is on the event id: a row
    /// found is at another flow or seq).
    pub by_event_id: bool,
}

fn read_quarantined(app: &Console) -> Result<Option<Vec<Quarantined>>, StoreError> {
    let Some(open) = &app.producer else {
        return Ok(None);
    };
    let rows = open()?.call(|s| s.outbox_entries(true, ROWS_MAX))?;
    let mut consumer = match &app.consumer {
        Some(open) => Some(open()?),
        None => None,
    };
    let mut out = Vec::with_capacity(rows.len());
    for outbox in rows {
        let env = &outbox.envelope;
        let (stored, by_event_id) = match consumer.as_mut() {
            Some(consumer) => match consumer
                .call(|s| s.inbox_entry_at(&env.inbox_flow(), env.seq))?
            {
                Some(at) => (Some(Some(at)), false),
                None => (
                    Some(consumer.call(|s| s.inbox_entry_of_event(&env.producer, &env.event_id))?),
                    true,
                ),
            },
            None => (None, false),
        };
        out.push(Quarantined {
            outbox,
            stored,
            by_event_id,
        });
    }
    Ok(Some(out))
}

async fn quarantined_page(State(app): State<App>) -> Response {
    read_then(&app, read_quarantined, |rows| {
        pages::quarantined(&app, rows.as_deref())
    })
    .await
}

/// The blocked rows: the totals by reason code and up to [`ROWS_MAX`]
/// rows, grouped by reason code.
pub struct Blocked {
    /// Blocked rows by reason code, all of them.
    pub totals: BTreeMap<String, u64>,
    /// The rows listed, by reason code.
    pub rows: BTreeMap<String, Vec<ordo_core::ops::InboxEntry>>,
}

fn read_blocked(app: &Console) -> Result<Option<Blocked>, StoreError> {
    let Some(open) = &app.consumer else {
        return Ok(None);
    };
    let mut consumer = open()?;
    let totals = consumer.call(|s| s.consumer_status())?.blocked;
    let mut rows: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for entry in consumer.call(|s| s.inbox_entries(true, InboxScope::All, ROWS_MAX))? {
        let code = entry
            .status
            .reason()
            .map_or_else(String::new, |r| r.code.as_str().to_owned());
        rows.entry(code).or_default().push(entry);
    }
    Ok(Some(Blocked { totals, rows }))
}

async fn blocked_page(State(app): State<App>) -> Response {
    read_then(&app, read_blocked, |blocked| {
        pages::blocked(&app, blocked.as_ref())
    })
    .await
}

async fn repairs_page(State(app): State<App>) -> Response {
    read_then(
        &app,
        |read| on_side(&read.consumer, |s| s.repairs()),
        |log| pages::repairs(log.as_deref()),
    )
    .await
}

/// The refusal of an action's POST in read-only mode, from another site's
/// page, or without the form's token; `None` lets it through.
fn refuse_action(app: &Console, headers: &axum::http::HeaderMap, csrf: &str) -> Option<Response> {
    let refused = if app.read_only {
        "the console is read-only"
    } else if !auth::same_origin(headers) {
        "cross-origin request refused"
    } else if !app.csrf.matches(csrf) {
        "the form's token is missing or stale; reload the page"
    } else {
        return None;
    };
    Some(pages::forbidden(refused).into_response())
}

/// Runs an action's `call` on a handle of the store `side` lends (the
/// store `name`d), on a blocking thread: what it did, or the page to answer
/// instead (a conflict for its refusal, a bad request without that store,
/// the error page of a failure).
async fn act<V, T, E>(
    app: &App,
    side: fn(&Console) -> &Option<Lender<V>>,
    name: &str,
    call: impl FnOnce(&mut V) -> Result<Result<T, E>, StoreError> + Send + 'static,
) -> Result<T, Response>
where
    V: ?Sized + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let read = Arc::clone(app);
    match blocking(move || on_side(side(&read), call)).await {
        Ok(Some(Ok(value))) => Ok(value),
        Ok(Some(Err(refused))) => Err(pages::conflict(&refused.to_string()).into_response()),
        Ok(None) => Err(pages::bad_request(&format!("no {name} store given")).into_response()),
        Err(response) => Err(response),
    }
}

#[derive(Deserialize)]
struct RetryForm {
    event_id: String,
    /// The destination whose quarantine to clear: needed on a store of
    /// several (`ordo outbox retry --destination`).
    #[serde(default)]
    destination: Option<String>,
    #[serde(default)]
    csrf: String,
}

/// Clears an event's quarantine so that the relay tries it once more:
/// `ordo outbox retry`, through the same library call.
async fn retry_quarantined(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    Form(form): Form<RetryForm>,
) -> Response {
    if let Some(refused) = refuse_action(&app, &headers, &form.csrf) {
        return refused;
    }
    let event_id = match field("event_id", EventId::new(&form.event_id)) {
        Ok(id) => id,
        Err(page) => return page.into_response(),
    };
    let destination = match form.destination.filter(|d| !d.is_empty()) {
        None => None,
        Some(name) => match field("destination", ordo_core::DestinationName::new(name)) {
            Ok(name) => Some(name),
            Err(page) => return page.into_response(),
        },
    };
    let id = event_id.clone();
    let call = move |s: &mut (dyn ProducerOps + Send + 'static)| {
        if let Some(name) = &destination {
            if let Err(refused) = s.use_destination(Some(name))? {
                return Ok(Err(ordo_core::ops::RetryRefused::Destination(refused)));
            }
        }
        s.retry_quarantined(&id)
    };
    if let Err(response) = act(&app, |c| &c.producer, "producer", call).await {
        return response;
    }
    tracing::info!(event_id = event_id.as_str(), "console: quarantine cleared");
    pages::done(&format!(
        "{}: quarantine cleared; the relay tries it once more.",
        event_id.as_str()
    ))
    .into_response()
}

/// What a skip of a flow's next event would change.
pub struct SkipPreview {
    /// The flow.
    pub flow: InboxFlow,
    /// Its applied seq (0 before the first).
    pub applied_seq: u64,
    /// The row stored at the next seq, if any: the one a skip settles.
    pub next: Option<ordo_core::ops::InboxEntry>,
}

fn read_skip_preview(app: &Console, flow: InboxFlow) -> Result<Option<SkipPreview>, StoreError> {
    let Some(open) = &app.consumer else {
        return Ok(None);
    };
    let mut consumer = open()?;
    let applied_seq = applied_seq(&mut consumer, &flow)?;
    let next = match i64::try_from(applied_seq + 1)
        .ok()
        .and_then(|s| ordo_core::Seq::new(s).ok())
    {
        Some(seq) => consumer.call(|s| s.inbox_entry_at(&flow, seq))?,
        None => None,
    };
    Ok(Some(SkipPreview {
        flow,
        applied_seq,
        next,
    }))
}

/// The preview of a skip: exactly what it changes, and the form asking for
/// the operator's name and reason, with a one-time confirmation token.
async fn skip_preview(State(app): State<App>, Query(query): Query<FlowQuery>) -> Response {
    if app.read_only {
        return pages::forbidden("the console is read-only").into_response();
    }
    let flow = match query.flow() {
        Ok(flow) => flow,
        Err(page) => return page.into_response(),
    };
    read_then(
        &app,
        move |read| read_skip_preview(read, flow),
        |preview| match preview {
            None => pages::bad_request("no consumer store given").into_response(),
            Some(preview) => {
                let confirm = preview.next.as_ref().and_then(|next| {
                    app.confirmations
                        .issue(preview.flow.clone(), next.envelope.seq)
                });
                pages::skip_preview(&app, &preview, confirm.as_deref()).into_response()
            }
        },
    )
    .await
}

#[derive(Deserialize)]
struct SkipForm {
    flow_id: String,
    #[serde(default)]
    producer: String,
    seq: i64,
    #[serde(default)]
    by: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
}

/// Skips the flow's next event: `ordo inbox skip`, through the same library
/// call, which appends the decision to the repair log. Needs a name, a
/// reason and the preview's one-time confirmation.
async fn skip(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    Form(form): Form<SkipForm>,
) -> Response {
    if let Some(refused) = refuse_action(&app, &headers, &form.csrf) {
        return refused;
    }
    let query = FlowQuery {
        id: form.flow_id.clone(),
        producer: Some(form.producer.clone()),
    };
    let (flow, seq) = match (query.flow(), ordo_core::Seq::new(form.seq)) {
        (Ok(flow), Ok(seq)) => (flow, seq),
        _ => return pages::bad_request("flow_id, producer or seq is not valid").into_response(),
    };
    let request = match ordo_core::ops::SkipRequest::new(
        flow.clone(),
        seq,
        form.reason.trim().to_owned(),
        form.by.trim().to_owned(),
    ) {
        Ok(request) => request,
        Err(invalid) => {
            let message = invalid
                .to_string()
                .replace("--reason", "the reason")
                .replace("--by", "the operator name");
            return pages::bad_request(&message).into_response();
        }
    };
    if !app.confirmations.redeem(&form.confirm, &flow, seq) {
        return pages::conflict(
            "this confirmation was already used or is unknown; preview the skip again",
        )
        .into_response();
    }
    let call = move |s: &mut (dyn ConsumerHandle + 'static)| s.skip(&request);
    let record = match act(&app, |c| &c.consumer, "consumer", call).await {
        Ok(record) => record,
        Err(response) => return response,
    };
    tracing::info!(
        flow_id = record.flow_id.as_str(),
        producer = record.producer.as_str(),
        seq = record.seq.get(),
        by = record.by.as_str(),
        "console: skipped"
    );
    pages::done(&format!(
        "skipped {} seq {} ({}) by {}: {} [repair {}]",
        record.flow_id.as_str(),
        record.seq.get(),
        record.event_id.as_str(),
        record.by,
        record.reason,
        record.id
    ))
    .into_response()
}

#[derive(Deserialize)]
struct ReevaluateForm {
    flow_id: String,
    #[serde(default)]
    producer: String,
    #[serde(default)]
    support_v2: Option<String>,
    #[serde(default)]
    csrf: String,
}

/// Re-evaluates a flow's blocked rows through the caller's handler.
async fn reevaluate(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    Form(form): Form<ReevaluateForm>,
) -> Response {
    if let Some(refused) = refuse_action(&app, &headers, &form.csrf) {
        return refused;
    }
    let Some(run) = app.reevaluate.clone() else {
        return pages::bad_request(
            "this store's domain re-evaluates blocked rows in the application's handler",
        )
        .into_response();
    };
    let query = FlowQuery {
        id: form.flow_id.clone(),
        producer: Some(form.producer.clone()),
    };
    let flow = match query.flow() {
        Ok(flow) => flow,
        Err(page) => return page.into_response(),
    };
    let support_v2 = form.support_v2.is_some();
    match tokio::task::spawn_blocking(move || run(&flow, support_v2)).await {
        Ok(Ok(line)) => {
            tracing::info!("console: {line}");
            pages::done(&line).into_response()
        }
        Ok(Err(message)) => pages::failure(&message).into_response(),
        Err(e) => pages::failure(&format!("the re-evaluation failed: {e}")).into_response(),
    }
}
