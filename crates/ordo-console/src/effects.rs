//! The effect intents page (EFFECTS.md): intents by state, and the
//! operators' audited actions on one (retry, resolve, skip), each previewed
//! first and confirmed with a one-time token, as `ordo effects retry`,
//! `resolve` and `skip` do through the same library call.

use std::collections::BTreeMap;

use axum::extract::{Form, Query, State};
use axum::response::{IntoResponse, Response};
use maud::html;
use ordo_core::effect::{
    EffectAction, EffectCounts, EffectEntry, EffectFilter, EffectKey, EffectState,
};
use ordo_core::ConsumerHandle;
use serde::Deserialize;

use crate::pages::{self, Page};
use crate::{act, read_then, refuse_action, App, Console, ROWS_MAX};

/// One-time confirmations of the effect actions previewed: each for one
/// action on one key, used up by the first POST that returns it.
#[derive(Default)]
pub struct EffectConfirmations(std::sync::Mutex<BTreeMap<String, (EffectKey, String)>>);

/// The most confirmations kept; older ones are dropped beyond it.
const CONFIRMATIONS_MAX: usize = 1000;

impl EffectConfirmations {
    fn issue(&self, key: EffectKey, action: &str) -> Option<String> {
        let token = crate::Csrf::generate().ok()?.as_str().to_owned();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CONFIRMATIONS_MAX {
            map.clear();
        }
        map.insert(token.clone(), (key, action.to_owned()));
        Some(token)
    }

    fn redeem(&self, token: &str, key: &EffectKey, action: &str) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(token)
            .is_some_and(|(k, a)| &k == key && a == action)
    }
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    #[serde(default)]
    state: Option<String>,
}

/// The intents of one state (all without), and the counts by state.
pub(crate) async fn effects_page(
    State(app): State<App>,
    Query(query): Query<ListQuery>,
) -> Response {
    let state = match query.state.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => match text.parse::<EffectState>() {
            Ok(state) => Some(state),
            Err(e) => return pages::bad_request(&e.rule).into_response(),
        },
    };
    read_then(
        &app,
        move |read| read_effects(read, state),
        |listed| effects_list(&app, state, listed.as_ref()),
    )
    .await
}

type Listed = (EffectCounts, Vec<EffectEntry>);

fn read_effects(
    app: &Console,
    state: Option<EffectState>,
) -> Result<Option<Listed>, ordo_core::StoreError> {
    let Some(open) = &app.consumer else {
        return Ok(None);
    };
    let mut consumer = open()?;
    let now_ms = app.clock.now_ms();
    let counts = consumer.call(|s| s.effect_counts(now_ms))?;
    let filter = EffectFilter {
        state,
        ..EffectFilter::default()
    };
    let rows = consumer.call(|s| s.effects(&filter, ROWS_MAX))?;
    Ok(Some((counts, rows)))
}

/// The actions a state allows, by their form names.
fn actions_of(state: EffectState) -> Vec<&'static str> {
    ["retry", "resolve_succeeded", "resolve_failed", "skip"]
        .into_iter()
        .filter(|name| {
            let action = action_named(name, None).expect("a known action");
            ordo_core::effect::operator_action(state, &action).is_ok()
        })
        .collect()
}

fn action_named(name: &str, result: Option<serde_json::Value>) -> Option<EffectAction> {
    match name {
        "retry" => Some(EffectAction::Retry),
        "resolve_succeeded" => Some(EffectAction::ResolveSucceeded(result)),
        "resolve_failed" => Some(EffectAction::ResolveFailed),
        "skip" => Some(EffectAction::Skip),
        _ => None,
    }
}

fn effects_list(console: &Console, state: Option<EffectState>, listed: Option<&Listed>) -> Page {
    let title = match state {
        Some(state) => format!("Effect intents: {state}"),
        None => "Effect intents".to_owned(),
    };
    let body = match listed {
        None => html! { p.note { "No consumer store given: the intents are the consumer's." } },
        Some((counts, rows)) => html! {
            p {
                @for s in EffectState::ALL {
                    a href={ "/effects?state=" (s.as_str()) } { (s.as_str()) }
                    " " span data-effect-state=(s.as_str()) { (counts.of(s)) } " · "
                }
                a href="/effects" { "all" }
            }
            @if rows.is_empty() {
                p.note { "No intent here." }
            } @else {
                table {
                    tr { th { "Key" } th { "State" } th { "Attempts" } th { "Waiting on" } th { "Last error" } th { "Actions" } }
                    @for e in rows {
                        tr {
                            td { code { (e.key.as_str()) } } td { (e.state.as_str()) } td { (e.attempts) }
                            td { (e.waiting_on.as_ref().map_or("", |k| k.as_str())) }
                            td { (e.last_error.as_deref().unwrap_or("")) }
                            td {
                                @if !console.read_only {
                                    @for name in actions_of(e.state) {
                                        a.action href={ "/effects/act?action=" (name) "&key=" (pages::urlencode(e.key.as_str())) } { (name) } " "
                                    }
                                }
                            }
                        }
                    }
                }
                (pages::truncated(rows.len()))
            }
        },
    };
    pages::ok(&title, body)
}

#[derive(Deserialize)]
pub(crate) struct ActQuery {
    key: String,
    action: String,
}

/// Shows what an action will change and asks for a name and a reason.
pub(crate) async fn effect_preview(
    State(app): State<App>,
    Query(query): Query<ActQuery>,
) -> Response {
    if app.read_only {
        return pages::forbidden("the console is read-only").into_response();
    }
    let key = match EffectKey::new(query.key.as_str()) {
        Ok(key) => key,
        Err(e) => return pages::bad_request(&e.rule).into_response(),
    };
    if action_named(&query.action, None).is_none() {
        return pages::bad_request(
            "the action is retry, resolve_succeeded, resolve_failed or skip",
        )
        .into_response();
    }
    let read_key = key.clone();
    read_then(
        &app,
        move |read| Ok(crate::on_side(&read.consumer, |s| s.effect(&read_key))?.flatten()),
        |entry| match entry {
            None => pages::bad_request("no effect intent has this key").into_response(),
            Some(entry) => {
                let confirm = app.effect_confirmations.issue(key, &query.action);
                preview(&app, &entry, &query.action, confirm.as_deref()).into_response()
            }
        },
    )
    .await
}

fn preview(console: &Console, entry: &EffectEntry, action: &str, confirm: Option<&str>) -> Page {
    let allowed = actions_of(entry.state).contains(&action);
    pages::ok(
        &format!("{action} effect intent"),
        html! {
            p { "Intent " code { (entry.key.as_str()) } " is " strong { (entry.state.as_str()) } " after " (entry.attempts) " attempts." }
            p { "Request (frozen under its key):" }
            pre { (entry.request) }
            @match (allowed, confirm) {
                (true, Some(confirm)) => form.action method="post" action="/effects/act" {
                    input type="hidden" name="key" value=(entry.key.as_str());
                    input type="hidden" name="action" value=(action);
                    input type="hidden" name="csrf" value=(console.csrf.as_str());
                    input type="hidden" name="confirm" value=(confirm);
                    @if action == "resolve_succeeded" {
                        p { label { "Result (JSON, optional) " input type="text" name="result" maxlength="65536"; } }
                    }
                    p { label { "Operator name " input type="text" name="by" required maxlength="100"; } }
                    p { label { "Reason " input type="text" name="reason" required maxlength="1000"; } }
                    p { "The action and who decided it are appended to the repair log in the same transaction." }
                    button type="submit" { (action) }
                }
                _ => p.note { "A " (entry.state.as_str()) " intent does not allow " (action) "." }
            }
        },
    )
}

#[derive(Deserialize)]
pub(crate) struct ActForm {
    key: String,
    action: String,
    #[serde(default)]
    result: String,
    #[serde(default)]
    by: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
}

/// Performs a previewed action, audited in the repair log.
pub(crate) async fn effect_act(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    Form(form): Form<ActForm>,
) -> Response {
    if let Some(refused) = refuse_action(&app, &headers, &form.csrf) {
        return refused;
    }
    let (action, key, by, reason) = match checked(&form) {
        Ok(checked) => checked,
        Err(page) => return page.into_response(),
    };
    if !app
        .effect_confirmations
        .redeem(&form.confirm, &key, &form.action)
    {
        return pages::conflict(
            "this confirmation was already used or is unknown; preview the action again",
        )
        .into_response();
    }
    let acted = key.clone();
    let call = move |s: &mut (dyn ConsumerHandle + 'static)| {
        s.act_on_effect(&acted, &action, &by, &reason)
    };
    match act(&app, |c| &c.consumer, "consumer", call).await {
        Ok(entry) => {
            tracing::info!(
                key = key.as_str(),
                action = form.action.as_str(),
                "console: effect action"
            );
            pages::done(&format!("{} {}: now {}", form.action, key, entry.state)).into_response()
        }
        Err(response) => response,
    }
}

/// The form's action, key, operator name and reason, or the page refusing
/// it (nothing written).
fn checked(form: &ActForm) -> Result<(EffectAction, EffectKey, String, String), Page> {
    let key = EffectKey::new(form.key.as_str()).map_err(|e| pages::bad_request(&e.rule))?;
    let result = match form.result.trim() {
        "" => None,
        text => Some(
            serde_json::from_str(text)
                .map_err(|e| pages::bad_request(&format!("the result is not JSON: {e}")))?,
        ),
    };
    let action =
        action_named(&form.action, result).ok_or_else(|| pages::bad_request("unknown action"))?;
    let (by, reason) = (form.by.trim(), form.reason.trim());
    if by.is_empty() || reason.is_empty() {
        return Err(pages::bad_request(
            "the operator name and the reason are required",
        ));
    }
    Ok((action, key, by.to_owned(), reason.to_owned()))
}
