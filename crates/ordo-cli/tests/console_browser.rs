//! `ordo console` in a real browser: headless Chromium driven over
//! WebDriver by chromedriver, both started here, against the real `ordo`
//! binary over real SQLite stores built with the real CLI.
//!
//! Its own command, so that the workspace's tests need no browser:
//!
//! ```text
//! cargo test -p ordo-cli --features browser --test console_browser
//! ```
//!
//! It needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian's
//! `chromium` and `chromium-driver`); without them every test fails saying
//! how to install them. With `ORDO_CONSOLE_SCREENSHOTS=DIR` (relative to the
//! workspace root, e.g. `docs/console`), the screenshot test writes a PNG of
//! each page into DIR.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::console::{repairs, status_metrics, token_file, troubled, Console, NOW, T0};
use common::{envelope, Lab};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{json, Value};
use tempfile::TempDir;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const INSTALL: &str = "install Chromium and its driver with \
    `apt-get update && apt-get install -y chromium chromium-driver`";

/// The page's viewport, and so the screenshots' size.
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 900;

/// A headless Chromium under its own chromedriver, in a temporary profile.
/// Dropping it (also when a test panics) kills chromedriver's process
/// group, the browser with it.
struct Browser {
    client: Option<Client>,
    driver: Child,
    _profile: TempDir,
}

/// Starts chromedriver on a port of its choosing: the process, its
/// stdout, and the port; or what it wrote on stderr when it exited first.
/// The process returned is the caller's: a [`Browser`] kills and reaps it
/// on drop.
#[allow(clippy::zombie_processes)]
fn start_driver(
    dir: &Path,
) -> Result<(Child, BufReader<std::process::ChildStdout>, String), String> {
    let stderr_path = dir.join("chromedriver.stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("chromedriver's stderr file");
    let mut driver = Command::new(CHROMEDRIVER)
        .arg("--port=0")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("{CHROMEDRIVER} does not start ({e}): {INSTALL}"));
    let mut lines = BufReader::new(driver.stdout.take().expect("stdout is piped"));
    // "ChromeDriver was started successfully on port N."
    loop {
        let mut line = String::new();
        // An unreadable stdout counts as the end of it.
        let read = lines.read_line(&mut line).unwrap_or(0);
        if read == 0 {
            let _ = driver.kill();
            let status = driver
                .wait()
                .map_or_else(|e| e.to_string(), |s| s.to_string());
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            return Err(format!("{status}: {}", stderr.trim()));
        }
        if let Some(rest) = line.split("started successfully on port ").nth(1) {
            let port = rest.trim().trim_end_matches('.').to_owned();
            return Ok((driver, lines, port));
        }
    }
}

impl Browser {
    async fn start() -> Browser {
        for path in [CHROMIUM, CHROMEDRIVER] {
            assert!(Path::new(path).exists(), "{path} is missing: {INSTALL}");
        }
        let profile = tempfile::tempdir().expect("a temporary directory");
        // A driver that exits before it listens is started again, twice at
        // most: its start is not what these tests check.
        let mut failures = Vec::new();
        let (driver, mut lines, port) = loop {
            match start_driver(profile.path()) {
                Ok(started) => break started,
                Err(why) if failures.len() < 2 => failures.push(why),
                Err(why) => {
                    failures.push(why);
                    panic!("chromedriver exited before listening ({failures:?}): {INSTALL}")
                }
            }
        };
        let mut browser = Browser {
            client: None,
            driver,
            _profile: profile,
        };
        std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--hide-scrollbars",
                    format!("--window-size={WIDTH},{HEIGHT}"),
                    format!("--user-data-dir={}", browser._profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| {
                panic!("chromium does not start under chromedriver ({e}): {INSTALL}")
            });
        browser.client = Some(client);
        // The window's size includes the browser's own frame: make the
        // page's viewport WIDTH x HEIGHT.
        let frame = browser
            .js("return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight];")
            .await;
        let frame = |i: usize| u32::try_from(frame[i].as_u64().expect("a size")).expect("small");
        browser
            .client()
            .set_window_size(WIDTH + frame(0), HEIGHT + frame(1))
            .await
            .expect("the window resizes");
        browser
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("a session")
    }

    /// Ends the session (the browser quits); the driver goes on drop.
    async fn close(mut self) {
        if let Some(client) = self.client.take() {
            client.close().await.expect("the session ends");
        }
    }

    async fn goto(&self, url: &str) {
        self.client()
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    }

    /// The path and query of the page shown.
    async fn at(&self) -> String {
        let url = self.client().current_url().await.expect("a current URL");
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// The first element matching `css`.
    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        match self.client().find(Locator::Css(css)).await {
            Ok(element) => element,
            Err(e) => panic!("no element {css} on {}: {e}", self.at().await),
        }
    }

    /// The rendered text of the first element matching `css`.
    async fn text(&self, css: &str) -> String {
        self.find(css)
            .await
            .text()
            .await
            .expect("an element's text")
    }

    /// The page's title (its `h1`).
    async fn title(&self) -> String {
        self.text("h1").await
    }

    /// Types `text` into the input named `name`.
    async fn fill(&self, name: &str, text: &str) {
        self.find(&format!("input[name='{name}']"))
            .await
            .send_keys(text)
            .await
            .expect("typing works");
    }

    async fn click(&self, css: &str) {
        self.find(css).await.click().await.expect("a click works");
    }

    /// Clicks `css`, which leaves the page (a link, a form's button), and
    /// waits until the next page has loaded: a click may return before the
    /// navigation it starts.
    async fn click_away(&self, css: &str) {
        self.js("window.ordoLeaving = true; return null;").await;
        self.click(css).await;
        let loaded =
            "return window.ordoLeaving === undefined && document.readyState === 'complete';";
        let deadline = Instant::now() + Duration::from_secs(60);
        // While the page is replaced, the script may fail: not loaded yet.
        while self.client().execute(loaded, vec![]).await.ok() != Some(json!(true)) {
            assert!(
                Instant::now() < deadline,
                "no new page after a click at {css}: still {}",
                self.at().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The value of `script`'s `return`, run in the page.
    async fn js(&self, script: &str) -> Value {
        self.client()
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("script {script}: {e}"))
    }

    /// A PNG of the window; written to `ORDO_CONSOLE_SCREENSHOTS/NAME.png`
    /// when that variable is set.
    async fn screenshot(&self, name: &str) {
        let png = self.client().screenshot().await.expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
        if let Some(dir) = screenshots_dir() {
            std::fs::create_dir_all(&dir).expect("the screenshot directory");
            let path = dir.join(format!("{name}.png"));
            std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let group = libc::pid_t::try_from(self.driver.id()).expect("a pid");
        // SAFETY: kill(2) on the process group of our own child, which it
        // leads (process_group(0)); the browser it started is in it.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// Where screenshots go, if they are asked for: `ORDO_CONSOLE_SCREENSHOTS`,
/// relative to the workspace root.
fn screenshots_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("ORDO_CONSOLE_SCREENSHOTS")?;
    Some(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(dir),
    )
}

fn both(lab: &Lab) -> [&str; 4] {
    ["--producer", &lab.p, "--consumer", &lab.c]
}

/// The troubled stores, a console over both, and a browser showing `path`
/// on it.
async fn troubled_at(path: &str) -> (Lab, Console, Browser) {
    let lab = troubled();
    let console = Console::start(&both(&lab));
    let browser = Browser::start().await;
    browser.goto(&console.url(path)).await;
    (lab, console, browser)
}

#[tokio::test]
async fn the_overview_shows_the_numbers_of_status_at_the_same_clock() {
    let (lab, _console, browser) = troubled_at("/").await;
    let status = lab.at(NOW).run_both("status", &[]).json();
    assert_eq!(browser.title().await, "Overview");
    for (name, value) in status_metrics(&status) {
        assert!(value.is_number(), "{name} in {status}");
        let shown = browser.text(&format!("[data-metric='{name}']")).await;
        assert_eq!(shown, value.to_string(), "{name}: {status}");
    }
    // The states built are the ones meant.
    assert_eq!(browser.text("[data-metric='quarantined']").await, "1");
    assert_eq!(browser.text("[data-metric='gaps_total']").await, "1");
    assert_ne!(browser.text("[data-metric='blocked']").await, "0");
    browser.close().await;
}

#[tokio::test]
async fn a_quarantined_event_shows_both_bodies() {
    let (_lab, _console, browser) = troubled_at("/quarantined").await;
    let section = "section.quarantined[data-event='A-1']";
    let bodies: Vec<Value> = {
        let cells = browser
            .client()
            .find_all(Locator::Css(&format!(
                "{section} table:last-of-type td pre"
            )))
            .await
            .expect("the bodies");
        let mut bodies = Vec::new();
        for cell in cells {
            let text = cell.text().await.expect("a body's text");
            bodies.push(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")));
        }
        bodies
    };
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    let (outbox, stored) = (&bodies[0], &bodies[1]);
    assert_eq!(outbox["event_id"], "A-1");
    assert_eq!(stored["event_id"], "A-1");
    assert_eq!(outbox["payload"]["amount"], 5, "the outbox body: {outbox}");
    assert_eq!(stored["payload"]["amount"], 9, "the stored body: {stored}");
    // The differing field is the one highlighted.
    let differs = browser
        .js(&format!(
            "return Array.from(document.querySelectorAll(\"{section} tr.differs td.field\"))\
             .map(function (td) {{ return td.textContent; }});"
        ))
        .await;
    assert_eq!(differs, json!(["payload.amount"]));
    let background = |css: &str| {
        format!(
            "return getComputedStyle(document.querySelector(\"{section} {css}\")).backgroundColor;"
        )
    };
    assert_ne!(
        browser.js(&background("tr.differs td")).await,
        browser.js(&background("tr:not(.differs) td")).await,
        "the difference stands out"
    );
    browser.close().await;
}

#[tokio::test]
async fn a_skip_needs_a_reason_then_moves_the_flow_on_into_the_repair_log() {
    let (lab, console, browser) = troubled_at("/flow?id=X").await;
    let before = repairs(&lab);
    assert_eq!(browser.text("#applied-seq").await, "0");
    browser.click_away("a[href='/flow/skip?id=X']").await;
    assert_eq!(browser.at().await, "/flow/skip?id=X");
    assert!(browser.text("#preview").await.contains("X-1"));
    // No reason: the form's own validation keeps the browser on the preview.
    browser.fill("by", "ops").await;
    browser.click("form.action button[type='submit']").await;
    assert_eq!(browser.at().await, "/flow/skip?id=X");
    let missing = "return document.querySelector(\"input[name='reason']\").validity.valueMissing;";
    assert_eq!(browser.js(missing).await, json!(true));
    // Blanks pass the browser; the console refuses them.
    browser.fill("reason", "   ").await;
    browser
        .click_away("form.action button[type='submit']")
        .await;
    assert_eq!(browser.title().await, "Bad request");
    assert!(browser.text("main").await.contains("reason"));
    assert_eq!(repairs(&lab), before, "nothing written");
    // A fresh preview, a name and a reason: the flow moves on.
    browser.goto(&console.url("/flow/skip?id=X")).await;
    browser.fill("by", "ops").await;
    browser.fill("reason", "schema 9 is retired").await;
    browser
        .click_away("form.action button[type='submit']")
        .await;
    assert!(
        browser.text("#done").await.contains("skipped X seq 1"),
        "{}",
        browser.text("main").await
    );
    let log = repairs(&lab);
    let log = log["repairs"].as_array().expect("a repair list");
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(
        (&log[0]["flow_id"], &log[0]["by"], &log[0]["reason"]),
        (&json!("X"), &json!("ops"), &json!("schema 9 is retired"))
    );
    browser.goto(&console.url("/flow?id=X")).await;
    assert_eq!(browser.text("#applied-seq").await, "1");
    browser.goto(&console.url("/repairs")).await;
    let row = browser.text("main table tr:last-child").await;
    assert!(
        row.contains("X") && row.contains("ops") && row.contains("schema 9 is retired"),
        "{row}"
    );
    browser.goto(&console.url("/")).await;
    assert_eq!(browser.text("[data-metric='skipped']").await, "1");
    browser.close().await;
}

#[tokio::test]
async fn a_payload_with_a_script_stays_text() {
    let lab = Lab::new();
    lab.at(T0).init();
    let script = "<script>window.ordoInjected = 'script';</script>";
    let image = "<img src=x onerror=\"window.ordoInjected = 'image'\">";
    let markup = envelope(
        "S-1",
        "S",
        1,
        9,
        script,
        json!({ "note": format!("{script}{image}") }),
    );
    lab.at(T0).receive(&markup);
    lab.at(T0).apply(&[]);
    let console = Console::start(&both(&lab));
    let browser = Browser::start().await;
    for path in ["/blocked", "/flow?id=S", "/flow/skip?id=S"] {
        browser.goto(&console.url(path)).await;
        let text = browser.text("main").await;
        assert!(
            text.contains(script),
            "{path}: the markup shows as text: {text}"
        );
        assert!(text.contains("<img src=x"), "{path}: {text}");
        assert_eq!(
            browser.js("return typeof window.ordoInjected;").await,
            json!("undefined"),
            "{path}: the payload ran"
        );
        // The page's only script is the console's own; no element came
        // from the payload.
        assert_eq!(
            browser
                .js("return Array.from(document.scripts).map(function (s) { return s.getAttribute('src'); });")
                .await,
            json!(["/static/console.js"]),
            "{path}"
        );
        assert_eq!(browser.js("return document.images.length;").await, json!(0));
    }
    browser.close().await;
}

/// How many action controls the page has: forms that do not merely search
/// (GET), and the buttons that submit them.
const ACTIONS: &str =
    "return Array.from(document.querySelectorAll('form, button, input[type=submit]'))\
    .filter(function (e) { var form = e.form || e; return form.method !== 'get'; }).length \
    + document.querySelectorAll(\"a[href^='/flow/skip']\").length;";

#[tokio::test]
async fn read_only_has_no_buttons() {
    let lab = troubled();
    let writable = Console::start(&both(&lab));
    let mut args = both(&lab).to_vec();
    args.push("--read-only");
    let read_only = Console::start(&args);
    let browser = Browser::start().await;
    let pages = [
        "/",
        "/flows",
        "/flow?id=A",
        "/flow?id=X",
        "/quarantined",
        "/blocked",
        "/repairs",
    ];
    for path in pages {
        browser.goto(&read_only.url(path)).await;
        assert_eq!(browser.js(ACTIONS).await, json!(0), "read-only {path}");
    }
    browser.goto(&read_only.url("/flow/skip?id=X")).await;
    assert_eq!(browser.title().await, "Refused");
    assert_eq!(browser.js(ACTIONS).await, json!(0));
    // The same pages of a console that is not read-only do have them.
    for path in ["/quarantined", "/flow?id=X", "/flow/skip?id=X"] {
        browser.goto(&writable.url(path)).await;
        let actions = browser.js(ACTIONS).await;
        assert!(actions.as_u64() > Some(0), "{path}: {actions}");
    }
    browser.close().await;
}

#[tokio::test]
async fn the_overview_refreshes_itself_when_the_stores_change() {
    let (lab, _console, browser) = troubled_at("/").await;
    let before = lab.at(NOW).run_both("status", &[]).json();
    let backlog = "[data-metric='backlog']";
    assert_eq!(
        browser.text(backlog).await,
        before["producer"]["backlog"].to_string()
    );
    browser.js("window.ordoSamePage = true; return null;").await;
    lab.at(T0 + 1_000).advance("D", 0, "reserved", Some(1));
    lab.at(T0 + 1_100).advance("E", 0, "reserved", Some(1));
    let after = lab.at(NOW).run_both("status", &[]).json();
    let expected = after["producer"]["backlog"].to_string();
    assert_ne!(before["producer"]["backlog"], after["producer"]["backlog"]);
    // The page's script polls every few seconds: wait for it, generously.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut shown = browser.text(backlog).await;
    while shown != expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        shown = browser.text(backlog).await;
    }
    assert_eq!(shown, expected, "the backlog shown follows the stores");
    assert_eq!(
        browser.js("return window.ordoSamePage === true;").await,
        json!(true),
        "updated in place, not reloaded"
    );
    browser.close().await;
}

#[tokio::test]
async fn every_page_behind_the_login_and_its_screenshot() {
    let lab = troubled();
    let token = token_file(&lab, 0o600);
    let mut args = both(&lab).to_vec();
    args.extend(["--token-file", token.as_str()]);
    let console = Console::start(&args);
    let browser = Browser::start().await;
    browser.goto(&console.url("/")).await;
    assert_eq!(browser.at().await, "/login");
    browser.fill("token", "s3cret-token").await;
    browser.screenshot("login").await;
    browser.click_away("form button[type='submit']").await;
    assert_eq!(browser.at().await, "/");
    // The session cookie is out of the page's scripts' reach.
    assert_eq!(browser.js("return document.cookie;").await, json!(""));
    let pages = [
        ("overview", "/", "Overview"),
        ("flows", "/flows", "Flows"),
        ("flow", "/flow?id=A", "Flow A"),
        ("quarantined", "/quarantined", "Quarantined events"),
        ("blocked", "/blocked", "Blocked events"),
        (
            "skip-preview",
            "/flow/skip?id=X",
            "Skip the next event of flow X",
        ),
    ];
    for (name, path, title) in pages {
        browser.goto(&console.url(path)).await;
        assert_eq!(browser.title().await, title, "{path}");
        browser.screenshot(name).await;
    }
    // From the preview shown last: a skip, so that the repair log has a row.
    browser.fill("by", "ops").await;
    browser.fill("reason", "schema 9 is retired").await;
    browser
        .click_away("form.action button[type='submit']")
        .await;
    assert!(browser.text("#done").await.contains("skipped X seq 1"));
    browser.goto(&console.url("/repairs")).await;
    assert_eq!(browser.title().await, "Repair log");
    assert!(browser.text("main").await.contains("schema 9 is retired"));
    browser.screenshot("repairs").await;
    browser.close().await;
}
