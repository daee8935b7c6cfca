//! `ordo console` as a real process over real stores built with the real
//! CLI, SQLite files and PostgreSQL databases (`ORDO_TEST_PG`, see
//! `pgdb`): the overview's numbers against `ordo status --json` at the
//! same clock, the flow search and its pages, flow detail, both bodies of
//! a quarantined event, the actions, escaping, the security headers, and
//! the operator token.

mod common;
mod pgdb;

use common::console::{
    repairs, status_metrics, token_file, troubled, troubled_in, Console, NOW, T0,
};
use common::http::{agent, hidden, page, post, Page};
use common::{envelope, reservation, run, Lab};
use pgdb::Database;
use serde_json::{json, Value};

/// Both sides in one PostgreSQL database.
fn pg_lab(db: &Database) -> Lab {
    Lab::with_stores(&db.url(), &db.url())
}

/// A lab's stores as they are (empty).
fn as_given(lab: Lab) -> Lab {
    lab
}

/// Each check as two tests: `FILES` on SQLite files, `POSTGRES` with both
/// sides in one PostgreSQL database of its own; `BUILD` makes the stores
/// of an empty lab.
macro_rules! on_both_backends {
    ($($files:ident, $postgres:ident: $check:ident($build:ident);)*) => {$(
        #[test]
        fn $files() {
            $check(&$build(Lab::new()));
        }

        #[test]
        fn $postgres() {
            let db = Database::create();
            $check(&$build(pg_lab(&db)));
        }
    )*};
}

on_both_backends! {
    the_overview_numbers_are_those_of_status_at_the_same_clock,
    on_postgres_the_overview_numbers_are_those_of_status:
        overview_is_status(troubled_in);
    flow_detail_and_quarantined_bodies_side_by_side,
    on_postgres_flow_detail_and_quarantined_bodies_side_by_side:
        detail_and_quarantined(troubled_in);
    an_event_id_conflict_shows_the_body_the_consumer_stores_under_that_id,
    on_postgres_an_event_id_conflict_shows_the_body_stored_under_that_id:
        quarantined_on_the_event_id(event_id_held_elsewhere);
    flows_are_searched_by_prefix_and_paged,
    on_postgres_flows_are_searched_by_prefix_and_paged:
        flows_by_prefix_and_page(as_given);
    read_only_shows_no_action_and_refuses_them,
    on_postgres_read_only_shows_no_action_and_refuses_them:
        read_only(troubled_in);
    a_skip_is_previewed_needs_a_name_and_a_reason_and_confirms_once,
    on_postgres_a_skip_moves_the_flow_and_lands_in_the_repair_log:
        skip_previewed_and_confirmed(troubled_in);
    blocked_rows_of_the_reservation_domain_are_re_evaluated_as_inbox_retry,
    on_postgres_blocked_rows_are_re_evaluated_as_inbox_retry:
        reevaluated_as_inbox_retry(as_given);
    two_producers_flows_of_one_id_are_two_flows,
    on_postgres_two_producers_flows_of_one_id_are_two_flows:
        producers_flows_apart(as_given);
}

/// Flow `A` of the default producer and flow `A` of `orders` are two flows:
/// the list shows both, and each one's page (`producer` beside `id`) shows
/// its own rows and projection; a bad producer name is a 400.
fn producers_flows_apart(lab: &Lab) {
    lab.at(T0).init();
    let mut orders: Value = serde_json::from_str(&reservation("A", 1, "reserved", 7)).unwrap();
    orders["producer"] = Value::from("orders");
    let batch = format!("{}\n{orders}\n", reservation("A", 1, "reserved", 5));
    lab.at(T0).receive(&batch);
    lab.at(T0).apply(&[]);
    let console = Console::start(&["--consumer", &lab.c]);
    let list = console.get("/flows");
    assert_eq!(list.flows(), ["A", "A"], "{}", list.text);
    assert!(list.text.contains("A of producer orders"), "{}", list.text);
    assert!(
        list.text
            .contains("href=\"/flow?id=A&amp;producer=orders\""),
        "{}",
        list.text
    );
    let quantity = |page: &Page| {
        let needle = "data-field=\"quantity\">";
        let at = page.text.find(needle).expect("a quantity") + needle.len();
        page.text[at..at + 1].to_owned()
    };
    let default = console.get("/flow?id=A");
    assert_eq!((default.status, quantity(&default)), (200, "5".to_owned()));
    let named = console.get("/flow?id=A&producer=orders");
    assert_eq!((named.status, quantity(&named)), (200, "7".to_owned()));
    assert!(
        named.text.contains("Flow A of producer orders"),
        "{}",
        named.text
    );
    assert_eq!(
        console.get("/flow?id=A&producer=Not%20A%20Name").status,
        400
    );
}

/// The consumer holds the producer's event id A-1 at another flow and seq
/// (Z, seq 2, received first): relaying A-1 is a conflict on the event id,
/// and A-1 is quarantined.
fn event_id_held_elsewhere(lab: Lab) -> Lab {
    lab.at(T0).init();
    lab.at(T0).advance("A", 0, "reserved", Some(5));
    let held = envelope("A-1", "Z", 2, 1, "confirmed", json!({"amount": 7}));
    let received = lab.at(T0 + 100).receive(&held);
    assert_eq!(received["receipts"][0]["receipt"], "accepted", "{received}");
    let relayed = lab.at(T0 + 200).relay(&[]);
    assert_eq!(relayed["deliveries"][0]["receipt"], "conflict", "{relayed}");
    lab
}

fn quarantined_on_the_event_id(lab: &Lab) {
    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c]);
    let quarantined = console.get("/quarantined");
    assert_eq!(quarantined.status, 200, "{quarantined:?}");
    let text = &quarantined.text;
    assert!(text.contains("data-event=\"A-1\""), "{text}");
    assert!(!text.contains("stores nothing"), "{text}");
    assert!(
        text.contains("the consumer stores it at flow <a href=\"/flow?id=Z\">Z</a>, seq 2."),
        "{text}"
    );
    // Both bodies, the differing fields marked: flow, seq, type, amount;
    // the event id and the schema alike.
    let differs: Vec<&str> = text
        .split("<tr class=\"differs\"><td class=\"field\">")
        .skip(1)
        .map(|rest| &rest[..rest.find('<').unwrap()])
        .collect();
    assert_eq!(
        differs,
        ["flow_id", "payload.amount", "seq", "type"],
        "{text}"
    );
    for amount in [5, 7] {
        assert!(
            text.contains(&format!("&quot;amount&quot;:{amount}"))
                || text.contains(&format!("\"amount\":{amount}")),
            "amount {amount}: {text}"
        );
    }
}

fn overview_is_status(lab: &Lab) {
    let status = lab.at(NOW).run_both("status", &[]).json();
    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c]);
    let overview = console.get("/");
    assert_eq!(overview.status, 200, "{overview:?}");
    for (name, value) in status_metrics(&status) {
        assert!(value.is_number(), "{name} in {status}");
        assert_eq!(overview.metric(name), value.to_string(), "{name}: {status}");
    }
    // The states built are the ones meant: each number is non-trivial.
    assert_eq!(overview.metric("quarantined"), "1");
    assert_ne!(overview.metric("blocked"), "0");
    assert_eq!(overview.metric("gaps_total"), "1");
    assert_ne!(overview.metric("applied"), "0");
    // The live refresh reads the same values.
    let live: Value = serde_json::from_str(&console.get("/overview.json").text).unwrap();
    for name in ["backlog", "quarantined", "blocked", "applied"] {
        assert_eq!(live[name], json!(overview.metric(name)), "{name}");
    }
    assert_eq!(console.terminate(), 0);
}

#[test]
fn one_side_leaves_the_other_sides_numbers_empty() {
    let lab = troubled();
    let status = consumer_status(&lab);
    let console = Console::start(&["--consumer", &lab.c]);
    let overview = console.get("/");
    for name in ["backlog", "oldest_pending_age_s", "quarantined"] {
        assert_eq!(overview.metric(name), "", "{name}");
    }
    assert_eq!(
        overview.metric("applied"),
        status["consumer"]["applied"].to_string()
    );
    // No pending event: the age is absent, and empty.
    let lab = Lab::new();
    lab.at(T0).init();
    let console = Console::start(&["--producer", &lab.p]);
    let overview = console.get("/");
    assert_eq!(overview.metric("backlog"), "0");
    assert_eq!(overview.metric("oldest_pending_age_s"), "");
    assert_eq!(overview.metric("applied"), "");
}

#[test]
fn pages_escape_markup_and_carry_the_security_headers() {
    let lab = troubled();
    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c]);
    for path in [
        "/",
        "/flows",
        "/flow?id=X",
        "/quarantined",
        "/blocked",
        "/repairs",
        "/static/console.js",
        "/static/console.css",
        "/login",
    ] {
        let page = console.get(path);
        assert_eq!(page.status, 200, "{path}: {page:?}");
        let csp = page.header("content-security-policy").unwrap_or("");
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{path}: {csp}"
        );
        assert_eq!(page.header("x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
        // A browser's form POSTs then carry the console's origin, not `null`.
        assert_eq!(page.header("referrer-policy"), Some("same-origin"));
        if page.text.contains("<html") {
            assert!(!page.text.contains("<script>"), "{path}: an inline script");
            assert!(!page.text.contains("style="), "{path}: an inline style");
        }
    }
    for path in ["/blocked", "/flow?id=X"] {
        let page = console.get(path);
        assert!(page.text.contains("X-1"), "{path}: {}", page.text);
        assert!(
            page.text
                .contains("&lt;script&gt;alert(&#39;type&#39;)&lt;/script&gt;")
                || page
                    .text
                    .contains("&lt;script&gt;alert('type')&lt;/script&gt;"),
            "{path}: {}",
            page.text
        );
        assert!(page.text.contains("&lt;script&gt;alert("), "{path}");
        assert!(!page.text.contains("<script>alert"), "{path}");
    }
}

fn detail_and_quarantined(lab: &Lab) {
    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c]);
    let a = console.get("/flow?id=A");
    assert_eq!(a.status, 200);
    assert!(
        a.text.contains("A-1") && a.text.contains("A-2"),
        "{}",
        a.text
    );
    assert!(
        a.text.contains("conflict"),
        "the quarantine shows: {}",
        a.text
    );
    assert!(
        a.text.contains("applied"),
        "the inbox rows' status: {}",
        a.text
    );
    // The reservation domain's projection: A-1 (amount 9, the consumer's
    // body) applied.
    for (field, value) in [
        ("state", "reserved"),
        ("quantity", "9"),
        ("applied_seq", "1"),
    ] {
        let cell = format!("data-field=\"{field}\">{value}<");
        assert!(a.text.contains(&cell), "{cell}: {}", a.text);
    }
    assert!(
        !a.text.contains("data-destination") && !quarantined_marks(&console),
        "one destination: no column of its own: {}",
        a.text
    );
    let g = console.get("/flow?id=G");
    assert!(g.text.contains("id=\"gap\""), "{}", g.text);
    assert!(g.text.contains("seq 1 is missing"), "{}", g.text);
    assert!(!a.text.contains("id=\"gap\""));
    let quarantined = console.get("/quarantined");
    assert!(
        quarantined.text.contains("data-event=\"A-1\""),
        "{}",
        quarantined.text
    );
    // amount 5 in the outbox, 9 at the consumer: that field differs, the
    // event id does not.
    let differs: Vec<&str> = quarantined
        .text
        .split("<tr class=\"differs\"><td class=\"field\">")
        .skip(1)
        .map(|rest| &rest[..rest.find('<').unwrap()])
        .collect();
    assert_eq!(differs, ["payload.amount"], "{}", quarantined.text);
    assert!(
        quarantined.text.contains("&quot;amount&quot;:5")
            || quarantined.text.contains("\"amount\":5")
    );
    let blocked = console.get("/blocked");
    assert!(blocked.text.contains("data-reason=\""), "{}", blocked.text);
    let repairs = console.get("/repairs");
    assert!(repairs.text.contains("No repair yet"), "{}", repairs.text);
    // Skips appear in the repair log.
    let out = lab.at(NOW).run(&[
        "inbox",
        "skip",
        "--json",
        "--consumer",
        &lab.c,
        "--flow",
        "X",
        "--seq",
        "1",
        "--reason",
        "bad <b>schema</b>",
        "--by",
        "ops",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let repairs = console.get("/repairs");
    assert!(
        repairs.text.contains("bad &lt;b&gt;schema&lt;/b&gt;"),
        "{}",
        repairs.text
    );
    assert_eq!(console.get("/").metric("skipped"), "1");
}

fn flows_by_prefix_and_page(lab: &Lab) {
    lab.at(T0).init();
    // 120 flows p-000..p-119 at the consumer, in one receive; q-1 and
    // producer flows beside them.
    let batch: String = (0..120)
        .map(|i| reservation(&format!("p-{i:03}"), 1, "reserved", 1) + "\n")
        .collect();
    lab.at(T0).receive(&batch);
    lab.at(T0).receive(&reservation("q-1", 1, "reserved", 1));
    lab.at(T0).advance("p-050", 0, "reserved", Some(1));
    lab.at(T0).advance("o-1", 0, "reserved", Some(1));
    lab.at(T0).apply(&[]);
    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c]);
    let expected = |range: std::ops::Range<usize>| -> Vec<String> {
        range.map(|i| format!("p-{i:03}")).collect()
    };
    let first = console.get("/flows?q=p-");
    assert_eq!(first.flows(), expected(0..50));
    let next = first.next().expect("a next page");
    let second = console.get(&next);
    assert_eq!(second.flows(), expected(50..100));
    let third = console.get(&second.next().expect("a third page"));
    assert_eq!(third.flows(), expected(100..120));
    assert_eq!(third.next(), None);
    assert_eq!(console.get("/flows?q=p-11").flows(), expected(110..120));
    assert_eq!(console.get("/flows?q=zz").flows(), Vec::<String>::new());
    // Without a prefix: every flow of either side, in id order.
    let all = console.get("/flows");
    assert_eq!(all.flows()[0], "o-1");
    assert_eq!(all.flows()[1], "p-000");
    // Both sides' view of a flow known to both.
    let p050 = second.text.split("data-flow=\"p-050\"").nth(1).unwrap();
    let cells: Vec<&str> = p050
        .split("<td>")
        .skip(2)
        .take(2)
        .map(|c| &c[..c.find('<').unwrap()])
        .collect();
    assert_eq!(cells, ["1", "1"], "last seq and applied seq: {p050}");
    assert_eq!(console.get("/flows?after=%3Cbad%3E").status, 400);
}

#[test]
fn a_missing_store_is_never_created() {
    let lab = Lab::new();
    let out = run(&["console", "--consumer", &lab.c, "--listen", "127.0.0.1:0"]);
    out.usage("does not exist");
    assert!(!std::path::Path::new(&lab.c).exists());
    run(&["console", "--listen", "127.0.0.1:0"]).usage("required");
}

#[test]
fn another_domain_keeps_the_flows_state_in_its_own_tables() {
    let db = Database::create();
    for lab in [Lab::new(), pg_lab(&db)] {
        lab.at(T0).run_both("init", &["--domain", "orders"]).json();
        let event = envelope("o-1", "O", 1, 1, "placed", json!({"total": 3}));
        lab.at(T0)
            .run_bytes(
                &["receive", "--json", "--consumer", &lab.c],
                event.as_bytes(),
            )
            .json();
        let console = Console::start(&["--consumer", &lab.c]);
        let page = console.get("/flow?id=O");
        assert!(page.text.contains("o-1"), "{}", page.text);
        assert!(
            page.text.contains("id=\"summary\"") && page.text.contains("application's own tables"),
            "{}",
            page.text
        );
        assert!(!page.text.contains("data-field="), "{}", page.text);
    }
}

#[test]
fn a_missing_postgres_store_is_never_created() {
    let db = Database::create();
    for side in ["--producer", "--consumer"] {
        let out = run(&["console", side, &db.url(), "--listen", "127.0.0.1:0"]);
        out.usage("does not exist");
    }
    assert_eq!(db.ordo_schemas(), Vec::<String>::new(), "nothing created");
}

#[test]
fn an_unreachable_server_is_named_without_its_password() {
    let url = "postgres://ops:hunter2@127.0.0.1:1/orders";
    for side in ["--producer", "--consumer"] {
        let out = run(&["console", side, url, "--listen", "127.0.0.1:0"]);
        out.storage_error();
        assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
        assert!(out.stderr.contains("127.0.0.1:1"), "{out:?}");
        assert!(!out.stderr.contains("hunter2"), "{out:?}");
    }
}

#[test]
fn on_postgres_one_side_leaves_the_other_sides_numbers_empty() {
    let db = Database::create();
    let lab = troubled_in(pg_lab(&db));
    let status = consumer_status(&lab);
    let console = Console::start(&["--consumer", &lab.c]);
    let overview = console.get("/");
    assert_eq!(overview.metric("backlog"), "");
    assert_eq!(
        overview.metric("blocked"),
        status["consumer"]["blocked"]["total"].to_string()
    );
    // Each side's flows, as on SQLite files.
    let files = troubled();
    let on_files = Console::start(&["--consumer", &files.c]);
    assert_eq!(console.get("/flows").flows(), ["A", "B", "G", "X"]);
    assert_eq!(on_files.get("/flows").flows(), ["A", "B", "G", "X"]);
    // The producer alone: its flows, and no inbox on the flow's page.
    let console = Console::start(&["--producer", &lab.p]);
    let on_files = Console::start(&["--producer", &files.p]);
    assert_eq!(console.get("/flows").flows(), ["A", "B", "C"]);
    assert_eq!(on_files.get("/flows").flows(), ["A", "B", "C"]);
    let a = console.get("/flow?id=A");
    assert!(
        a.text.contains("A-2") && !a.text.contains("Inbox"),
        "{}",
        a.text
    );
    assert_eq!(console.get("/").metric("applied"), "");
}

#[test]
fn beyond_loopback_only_with_a_private_token_file() {
    let lab = troubled();
    let out = run(&["console", "--consumer", &lab.c, "--listen", "0.0.0.0:0"]);
    out.usage("--token-file");
    let open = token_file(&lab, 0o644);
    let out = run(&[
        "console",
        "--consumer",
        &lab.c,
        "--listen",
        "0.0.0.0:0",
        "--token-file",
        &open,
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains(&open), "{out:?}");
}

#[test]
fn with_a_token_every_page_needs_the_login() {
    let lab = troubled();
    let token = token_file(&lab, 0o600);
    let console = Console::start(&["--consumer", &lab.c, "--token-file", &token]);
    for path in ["/", "/flows", "/blocked", "/overview.json", "/flow?id=A"] {
        let page = console.get(path);
        assert_eq!(page.status, 303, "{path}: {page:?}");
        assert_eq!(page.header("location"), Some("/login"), "{path}");
        assert!(!page.text.contains("data-metric"));
    }
    let wrong = console.login("s3cret-tokeN");
    assert_eq!(wrong.status, 401, "{wrong:?}");
    assert_eq!(wrong.header("set-cookie"), None);
    let forged = console.get_with_cookie("/", "ordo_console=00");
    assert_eq!(forged.status, 303);
    let right = console.login("s3cret-token");
    assert_eq!(right.status, 303, "{right:?}");
    let cookie = right.header("set-cookie").expect("a session cookie");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    // The browser forgets it after a working shift.
    let max_age = cookie
        .split(';')
        .find_map(|attr| attr.trim().strip_prefix("Max-Age="))
        .unwrap_or_else(|| panic!("the cookie expires: {cookie}"));
    assert_eq!(
        max_age.parse::<u64>().ok(),
        Some(ordo_console::SESSION_MAX_AGE_S),
        "{cookie}"
    );
    assert_eq!(ordo_console::SESSION_MAX_AGE_S, 12 * 60 * 60);
    // The console itself refuses the cookie once the session is over, even
    // if a browser kept it: the cookie carries the time of the login.
    let max_age_ms = 12 * 60 * 60 * 1000;
    let args = ["--consumer", lab.c.as_str(), "--token-file", token.as_str()];
    let pair = cookie.split(';').next().unwrap();
    let last = Console::start_at(NOW + max_age_ms - 1, &args);
    assert_eq!(last.get_with_cookie("/", pair).status, 200);
    let over = Console::start_at(NOW + max_age_ms, &args);
    let refused = over.get_with_cookie("/", pair);
    assert_eq!(refused.status, 303, "{refused:?}");
    assert_eq!(refused.header("location"), Some("/login"));
    assert!(
        !cookie.contains("s3cret"),
        "the cookie is not the token: {cookie}"
    );
    let overview = console.get_with_cookie("/", pair);
    assert_eq!(overview.status, 200, "{overview:?}");
    assert_ne!(overview.metric("blocked"), "");
    // A login from another site's page is refused.
    let cross = page(
        agent()
            .post(&console.url("/login"))
            .header("Origin", "http://evil.example")
            .send_form([("token", "s3cret-token")]),
    );
    assert_eq!(cross.status, 403, "{cross:?}");
    assert_eq!(console.terminate(), 0);
}

/// `ordo status --json` of the lab's consumer alone, at the console's clock.
fn consumer_status(lab: &Lab) -> Value {
    lab.at(NOW)
        .run(&["status", "--json", "--consumer", &lab.c])
        .json()
}

fn quarantined_ids(lab: &Lab) -> Vec<String> {
    let out = lab
        .at(NOW)
        .run(&[
            "outbox",
            "list",
            "--json",
            "--producer",
            &lab.p,
            "--quarantined",
        ])
        .json();
    out["outbox"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn retrying_a_quarantined_event_needs_the_form_token_and_the_same_origin() {
    let lab = troubled();
    assert_eq!(quarantined_ids(&lab), ["A-1"]);
    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c]);
    let quarantined = console.get("/quarantined");
    assert!(quarantined.text.contains("action=\"/quarantined/retry\""));
    let csrf = hidden(&quarantined, "csrf").expect("the form carries its token");
    assert_eq!(hidden(&quarantined, "event_id").as_deref(), Some("A-1"));
    let refused = [
        console.post_own("/quarantined/retry", &[("event_id", "A-1")]),
        console.post_own("/quarantined/retry", &[("event_id", "A-1"), ("csrf", "00")]),
        post(
            &console,
            "/quarantined/retry",
            Some("http://evil.example"),
            &[("event_id", "A-1"), ("csrf", &csrf)],
        ),
    ];
    for page in refused {
        assert_eq!(page.status, 403, "{page:?}");
    }
    assert_eq!(quarantined_ids(&lab), ["A-1"], "nothing written");
    let done = console.post_own(
        "/quarantined/retry",
        &[("event_id", "A-1"), ("csrf", &csrf)],
    );
    done.assert_says(200, "id=\"done\"");
    assert_eq!(quarantined_ids(&lab), Vec::<String>::new());
    // The store's own refusal, as `ordo outbox retry` gives it.
    let again = console.post_own(
        "/quarantined/retry",
        &[("event_id", "A-1"), ("csrf", &csrf)],
    );
    again.assert_says(409, "not quarantined");
    assert_eq!(console.get("/").metric("quarantined"), "0");
}

fn read_only(lab: &Lab) {
    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c, "--read-only"]);
    for path in ["/", "/quarantined", "/blocked", "/flow?id=A", "/repairs"] {
        let page = console.get(path);
        assert_eq!(page.status, 200, "{path}");
        assert!(
            !page.text.contains("method=\"post\""),
            "{path}: {}",
            page.text
        );
        assert!(!page.text.contains("<button"), "{path}: {}", page.text);
    }
    assert!(console
        .get("/quarantined")
        .text
        .contains("data-event=\"A-1\""));
    let refused = console.post_own(
        "/quarantined/retry",
        &[("event_id", "A-1"), ("csrf", "whatever")],
    );
    assert_eq!(refused.status, 403, "{refused:?}");
    assert_eq!(quarantined_ids(lab), ["A-1"]);
}

fn skip_previewed_and_confirmed(lab: &Lab) {
    let before = repairs(lab);
    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c]);
    assert!(console
        .get("/flow?id=X")
        .text
        .contains("href=\"/flow/skip?id=X\""));
    let preview = console.get("/flow/skip?id=X");
    preview.assert_says(200, "id=\"preview\"");
    assert!(preview.text.contains("X-1"), "{}", preview.text);
    assert!(
        preview.text.contains("moves from 0 to 1"),
        "{}",
        preview.text
    );
    let csrf = hidden(&preview, "csrf").unwrap();
    let confirm = hidden(&preview, "confirm").unwrap();
    let form = |by: &'static str, reason: &'static str| {
        [
            ("flow_id", "X".to_owned()),
            ("seq", "1".to_owned()),
            ("csrf", csrf.clone()),
            ("confirm", confirm.clone()),
            ("by", by.to_owned()),
            ("reason", reason.to_owned()),
        ]
    };
    let send = |fields: &[(&str, String)]| {
        let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        console.post_own("/flow/skip", &pairs)
    };
    let no_reason = send(&form("ops", "  "));
    no_reason.assert_says(400, "reason");
    let no_name = send(&form("", "bad schema"));
    assert_eq!(no_name.status, 400, "{no_name:?}");
    assert_eq!(repairs(lab), before, "nothing written");
    let done = send(&form("ops", "schema 9 is retired"));
    done.assert_says(200, "skipped X seq 1");
    let after = repairs(lab);
    let log = after["repairs"].as_array().expect("a repair list");
    assert_eq!(log.len(), 1, "{after}");
    assert_eq!(log[0]["flow_id"], "X");
    assert_eq!(log[0]["by"], "ops");
    assert_eq!(log[0]["reason"], "schema 9 is retired");
    // The confirmation is used up.
    let again = send(&form("ops", "schema 9 is retired"));
    assert_eq!(again.status, 409, "{again:?}");
    assert_eq!(repairs(lab), after);
    assert!(console.get("/repairs").text.contains("schema 9 is retired"));
    assert_eq!(console.get("/").metric("skipped"), "1");
    // Nothing stored at G's next seq: nothing to skip, no form.
    let gap = console.get("/flow/skip?id=G");
    assert!(!gap.text.contains("method=\"post\""), "{}", gap.text);
    let read_only = Console::start(&["--consumer", &lab.c, "--read-only"]);
    assert_eq!(read_only.get("/flow/skip?id=X").status, 403);
    assert!(!read_only.get("/flow?id=X").text.contains("/flow/skip"));
}

fn reevaluated_as_inbox_retry(lab: &Lab) {
    lab.at(T0).init();
    let v2 = envelope("V-1", "V", 1, 2, "reserved", json!({"units": 3}));
    lab.at(T0).receive(&v2);
    lab.at(T0).apply(&[]);
    let blocked_flows = |lab: &Lab| -> Vec<String> {
        let out = lab
            .at(NOW)
            .run(&["inbox", "list", "--json", "--consumer", &lab.c, "--blocked"])
            .json();
        out["inbox"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["flow_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(blocked_flows(lab), ["V"]);
    let console = Console::start(&["--consumer", &lab.c]);
    let page = console.get("/blocked");
    assert!(
        page.text.contains("action=\"/blocked/reevaluate\""),
        "{}",
        page.text
    );
    let csrf = hidden(&page, "csrf").unwrap();
    let still = console.post_own("/blocked/reevaluate", &[("flow_id", "V"), ("csrf", &csrf)]);
    still.assert_says(200, "stop blocked");
    assert_eq!(blocked_flows(lab), ["V"]);
    let refused = console.post_own(
        "/blocked/reevaluate",
        &[("flow_id", "V"), ("support_v2", "on")],
    );
    assert_eq!(refused.status, 403, "{refused:?}");
    let applied = console.post_own(
        "/blocked/reevaluate",
        &[("flow_id", "V"), ("support_v2", "on"), ("csrf", &csrf)],
    );
    applied.assert_says(200, "applied 1");
    assert_eq!(blocked_flows(lab), Vec::<String>::new());
    assert_eq!(console.get("/").metric("blocked"), "0");
}

/// Whether the quarantined page lists any event's marks by destination.
fn quarantined_marks(console: &Console) -> bool {
    console
        .get("/quarantined")
        .text
        .contains("data-destination")
}

/// A producer of the destinations `default` and `billing`, whose consumer
/// holds another body at A-1, and `late`, added after flow A began: the
/// flow page shows each destination's marks of each row (default holds
/// both events; billing has A-1 quarantined with its reason and A-2
/// pending behind it; late is not delivered A), and the quarantined page
/// says where A-1 is quarantined.
#[test]
fn with_two_destinations_the_outbox_shows_each_destinations_marks() {
    let lab = Lab::new();
    lab.at(T0).init();
    let billing = lab.path("billing.db");
    lab.run(&["init", "--json", "--consumer", &billing]).json();
    let add = [
        "destination",
        "add",
        "--json",
        "--producer",
        &lab.p,
        "billing",
    ];
    lab.run(&add).json();
    lab.advance("A", 0, "reserved", Some(5));
    lab.advance("A", 1, "confirmed", None);
    let late = [
        "destination",
        "add",
        "--json",
        "--producer",
        &lab.p,
        "late",
        "--from",
        "now",
    ];
    lab.run(&late).json();
    let other = reservation("A", 1, "reserved", 99);
    lab.run_bytes(
        &["receive", "--json", "--consumer", &billing],
        other.as_bytes(),
    )
    .json();
    let relay = |destination: &str, consumer: &str| {
        let args = [
            "relay",
            "--json",
            "--producer",
            &lab.p,
            "--consumer",
            consumer,
        ];
        lab.at(T0 + 100)
            .run(&[&args[..], &["--destination", destination]].concat())
            .json()
    };
    relay("default", &lab.c);
    relay("billing", &billing);

    let console = Console::start(&["--producer", &lab.p, "--consumer", &lab.c]);
    let a = console.get("/flow?id=A");
    assert_eq!(a.status, 200, "{}", a.text);
    for header in [
        "<th>At billing</th>",
        "<th>At default</th>",
        "<th>At late</th>",
    ] {
        assert!(a.text.contains(header), "{header}: {}", a.text);
    }
    let cells: Vec<(&str, &str)> = (a.text.split("<td data-destination=\"").skip(1))
        .map(|rest| {
            let name = &rest[..rest.find('"').unwrap()];
            let mark = rest.split("data-mark=\"").nth(1).unwrap();
            (name, &mark[..mark.find('"').unwrap()])
        })
        .collect();
    assert_eq!(
        cells,
        [
            ("billing", "quarantined"),
            ("default", "accepted"),
            ("late", "not-delivered"),
            ("billing", "pending"),
            ("default", "accepted"),
            ("late", "not-delivered"),
        ],
        "A-1 then A-2, a column per destination (late gets only later flows): {}",
        a.text
    );
    assert!(
        a.text.contains("quarantined: conflict (") && a.text.contains("accepted at "),
        "the reason and the times: {}",
        a.text
    );
    let quarantined = console.get("/quarantined");
    for (name, mark) in [("billing", "quarantined"), ("default", "accepted")] {
        let item = format!("<li data-destination=\"{name}\" data-mark=\"{mark}\">At {name}: ");
        assert!(
            quarantined.text.contains(&item),
            "{item}: {}",
            quarantined.text
        );
    }
    assert!(
        !quarantined.text.contains("data-destination=\"late\""),
        "only the destinations of its flow: {}",
        quarantined.text
    );
    // The retry names the destination that quarantined it.
    assert!(
        quarantined
            .text
            .contains("ordo outbox retry --destination billing")
            && quarantined
                .text
                .contains("name=\"destination\" value=\"billing\""),
        "{}",
        quarantined.text
    );
    let csrf = hidden(&quarantined, "csrf").expect("the form carries its token");
    let retry = |destination: &str| {
        let form = [
            ("event_id", "A-1"),
            ("destination", destination),
            ("csrf", csrf.as_str()),
        ];
        console.post_own("/quarantined/retry", &form)
    };
    retry("nowhere").assert_says(409, "no destination named nowhere");
    retry("default").assert_says(409, "not quarantined");
    retry("Bad Name").assert_says(400, "destination");
    let listed = |lab: &Lab| {
        let args = [
            "outbox",
            "list",
            "--json",
            "--producer",
            &lab.p,
            "--quarantined",
        ];
        lab.run(&args).json()["outbox"].as_array().unwrap().len()
    };
    assert_eq!(listed(&lab), 1, "nothing written");
    retry("billing").assert_says(200, "id=\"done\"");
    assert_eq!(listed(&lab), 0, "billing's quarantine cleared");
}
