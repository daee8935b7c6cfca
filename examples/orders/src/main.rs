//! Orders and shipping: two services, each with its own SQLite file, joined
//! by ordo in one process.
//!
//! `orders-example [DIR] [N]` places N orders (default 100) in DIR (default:
//! a temporary directory), pays or cancels most of them, restarts halfway
//! (the runner stopped, every handle dropped, all reopened), waits until
//! shipping has settled every event, prints a summary, and exits 1 if an
//! event was lost or applied twice (2 on an error).

mod orders;
mod shipping;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ordo_core::{ConsumerOps, InboxStatus, ProducerOps};
use ordo_runtime::{RunReport, Runner, RunnerOptions};
use ordo_sqlite::{ConsumerDb, ProducerDb};

use orders::Orders;

/// Any error: `?` takes SQLite errors, store errors and append refusals alike.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool, Error> {
    let mut args = std::env::args().skip(1);
    let temp = tempfile::tempdir()?;
    let dir = args.next().map_or(temp.path().to_owned(), PathBuf::from);
    let count: i64 = args.next().map(|n| n.parse()).transpose()?.unwrap_or(100);
    std::fs::create_dir_all(&dir)?;

    let (mut orders, mut runner) = start(&dir)?;
    let mut reports = Vec::new();
    let first = orders.count()?;
    for i in 0..count {
        if i == count / 2 {
            reports.push(runner.stop()?);
            drop(orders);
            (orders, runner) = start(&dir)?;
        }
        let order_id = format!("order-{}", first + i);
        orders.place(&order_id, "ada", 1_000 + i)?;
        match i % 3 {
            0 => orders.pay(&order_id)?,
            1 => orders.cancel(&order_id, "changed their mind")?,
            _ => {} // left placed
        }
    }
    let mut shipping = ConsumerDb::open(dir.join("shipping.db"), &shipping::schema())?;
    let runner = wait_settled(&mut orders.db, &mut shipping, runner)?;
    reports.push(runner.stop()?);
    println!("{count} orders placed in {}", dir.display());
    check(&mut orders, &mut shipping, &reports)
}

/// Opens the orders service, and starts the relay (orders to shipping) and
/// the apply loop (shipping's handler), each with its own handles.
fn start(dir: &Path) -> Result<(Orders, Runner), Error> {
    let (orders_db, shipping_db) = (dir.join("orders.db"), dir.join("shipping.db"));
    let orders = Orders::open(&orders_db)?;
    let mut runner = Runner::new(RunnerOptions::default());
    runner.spawn_relay(
        ProducerDb::open(&orders_db, &orders::schema())?,
        ConsumerDb::open(&shipping_db, &shipping::schema())?,
    )?;
    let apply = ConsumerDb::open(&shipping_db, &shipping::schema())?;
    runner.spawn_apply(apply, shipping::Shipping)?;
    Ok((orders, runner))
}

/// Waits until shipping holds every committed event and none is pending.
fn wait_settled(
    orders: &mut ProducerDb,
    shipping: &mut ConsumerDb,
    runner: Runner,
) -> Result<Runner, Error> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let committed = orders.outbox()?.len();
        let inbox = shipping.inbox()?;
        if inbox.len() == committed && inbox.iter().all(|r| r.status != InboxStatus::Pending) {
            return Ok(runner);
        }
        if runner.failed() {
            return Err(runner
                .stop()
                .err()
                .map_or("a loop ended".into(), Error::from));
        }
        if Instant::now() > deadline {
            return Err(format!("shipping settled {} of {committed} events", inbox.len()).into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Prints the summary; false if an event was lost or applied twice.
fn check(
    orders: &mut Orders,
    shipping: &mut ConsumerDb,
    runs: &[RunReport],
) -> Result<bool, Error> {
    let outbox = orders.db.outbox()?;
    let inbox = shipping.inbox()?;
    let mut problems = Vec::new();
    let received: HashSet<_> = inbox.iter().map(|r| &r.envelope.event_id).collect();
    for lost in outbox
        .iter()
        .filter(|r| !received.contains(&r.envelope.event_id))
    {
        problems.push(format!("lost: {}", lost.envelope.event_id));
    }
    let (mut applied, mut blocked) = (BTreeMap::<&str, i64>::new(), HashSet::new());
    for row in &inbox {
        let order_id = row.envelope.flow_id.as_str();
        match &row.status {
            InboxStatus::Applied => *applied.entry(order_id).or_default() += 1,
            InboxStatus::Blocked(reason) => {
                println!("blocked: {} {reason}", row.envelope.event_id);
                blocked.insert(order_id);
            }
            _ => {}
        }
    }
    let shipments = rows(
        shipping.connection(),
        "SELECT order_id, status, events FROM shipments",
    )?;
    let shipments: BTreeMap<_, _> = shipments
        .into_iter()
        .map(|(id, s, n)| (id, (s, n)))
        .collect();
    for (order_id, status, _) in rows(
        orders.db.connection(),
        "SELECT order_id, status, 0 FROM orders",
    )? {
        let (shipped, events) = shipments.get(&order_id).cloned().unwrap_or_default();
        let applied = applied.get(order_id.as_str()).copied().unwrap_or(0);
        if events != applied {
            problems.push(format!(
                "{order_id}: {applied} events applied, {events} in its shipment"
            ));
        }
        let expected = [
            ("placed", "pending"),
            ("paid", "ready"),
            ("cancelled", "cancelled"),
        ];
        let agrees = expected.contains(&(status.as_str(), shipped.as_str()));
        if !agrees && !blocked.contains(order_id.as_str()) {
            problems.push(format!("{order_id} is {status}, its shipment {shipped:?}"));
        }
    }
    let total_applied: i64 = applied.values().sum();
    println!(
        "events: {} committed, {total_applied} applied, {} blocked",
        outbox.len(),
        blocked.len()
    );
    for (n, run) in runs.iter().enumerate() {
        println!(
            "run {}: relayed {}, applied {}",
            n + 1,
            run.relay.accepted,
            run.apply.applied
        );
    }
    problems.iter().for_each(|p| eprintln!("{p}"));
    if problems.is_empty() {
        println!("nothing lost, nothing doubled");
    }
    Ok(problems.is_empty())
}

fn rows(
    conn: &ordo_sqlite::rusqlite::Connection,
    sql: &str,
) -> Result<Vec<(String, String, i64)>, Error> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}
