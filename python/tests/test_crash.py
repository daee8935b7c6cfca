"""Crash tests: Python processes killed with SIGKILL, then recovered.

A producer process appends in a loop (three orders and their events per
transaction) and is killed mid-append; an applier process applies with a
handler that sleeps a little per event and is killed mid-batch. After
each, a fresh process relays and applies; the application's tables are
then checked against the outbox and the inbox: every committed order has
its event and no event is without its order, nothing acknowledged is lost,
and every event is shipped exactly once.
"""

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import ordo

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")

COMMON = textwrap.dedent(
    """
    import sys, time
    import ordo

    def producer(path):
        return ordo.Producer.open(path, domain="orders", name="orders", migrations=[
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, flow TEXT NOT NULL)"])

    def consumer(path):
        return ordo.Consumer.open(path, domain="shipping", migrations=[
            "CREATE TABLE shipments (flow TEXT NOT NULL, seq INTEGER NOT NULL,"
            " order_id INTEGER NOT NULL UNIQUE, PRIMARY KEY (flow, seq))"])

    def ship(tx, event):
        tx.execute("INSERT INTO shipments VALUES (?, ?, ?)",
                   (event.flow_id, event.seq, event.payload["order"]))
    """
)

# Appends forever, three orders per transaction, printing each committed
# transaction's last order id once it has committed.
PRODUCE = COMMON + textwrap.dedent(
    """
    p = producer(sys.argv[1])
    order = 0
    while True:
        with p.transaction() as tx:
            for _ in range(3):
                order += 1
                flow = "f%d" % (order % 7)
                tx.execute("INSERT INTO orders VALUES (?, ?)", (order, flow))
                tx.append(flow, "order_placed", {"order": order})
        print(order, flush=True)
    """
)

# Applies with a slow handler, printing each event it is handed before it
# sleeps: the batch in progress is never committed before the kill.
APPLY_SLOWLY = COMMON + textwrap.dedent(
    """
    c = consumer(sys.argv[1])
    def slow(tx, event):
        ship(tx, event)
        print(event.event_id, flush=True)
        time.sleep(0.01)
    c.apply(slow, batch=int(sys.argv[2]))
    print("done", flush=True)
    """
)

# A fresh process: relays everything, applies everything.
RECOVER = COMMON + textwrap.dedent(
    """
    p, c = producer(sys.argv[1]), consumer(sys.argv[2])
    relayed = ordo.relay(p, c)
    applied = c.apply(ship)
    print(relayed.deliveries_total, sum(f["applied"] for f in applied.flows), flush=True)
    """
)


def run(script, *args):
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def kill_after(script, args, lines, seconds_max=60):
    """Starts ``script``, waits for ``lines`` lines of its output, kills it
    with SIGKILL at once and returns the lines it printed."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen = []
    deadline = time.monotonic() + seconds_max
    try:
        while len(seen) < lines:
            line = child.stdout.readline()
            if not line:
                pytest.fail(f"the child ended early: {child.wait()} {child.stderr.read()}")
            seen.append(line.strip())
            assert time.monotonic() < deadline, "the child is too slow"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return seen


ORDERS = ["CREATE TABLE orders (id INTEGER PRIMARY KEY, flow TEXT NOT NULL)"]
SHIPMENTS = [
    "CREATE TABLE shipments (flow TEXT NOT NULL, seq INTEGER NOT NULL,"
    " order_id INTEGER NOT NULL UNIQUE, PRIMARY KEY (flow, seq))"
]


def outbox(path):
    with ordo.Producer.open(path, domain="orders", name="orders", migrations=ORDERS) as p:
        orders = dict(p.query("SELECT id, flow FROM orders"))
        events = p.query("SELECT event_id, flow_id, seq, body FROM outbox ORDER BY position")
    return orders, events


def check_produced(path, acknowledged):
    orders, events = outbox(path)
    by_order = {}
    for event_id, flow, seq, body in events:
        order = json.loads(body)["payload"]["order"]
        assert order not in by_order, f"order {order} has two events"
        by_order[order] = (flow, seq)
    # The orders and their events committed together, or neither did.
    assert set(by_order) == set(orders)
    assert all(orders[o] == by_order[o][0] for o in orders)
    # Nothing acknowledged is lost; transactions are whole.
    assert set(range(1, acknowledged + 1)) <= set(orders)
    assert len(orders) % 3 == 0 and set(orders) == set(range(1, len(orders) + 1))
    # Each flow's seq is contiguous from 1.
    for flow in {f for f, _ in by_order.values()}:
        seqs = sorted(s for f, s in by_order.values() if f == flow)
        assert seqs == list(range(1, len(seqs) + 1))
    return orders, by_order


def check_shipped(consumer_path, by_order):
    with ordo.Consumer.open(consumer_path, domain="shipping", migrations=SHIPMENTS) as c:
        shipped = c.query("SELECT order_id, flow, seq FROM shipments")
        inbox = c.inbox()
    assert sorted(o for o, _, _ in shipped) == sorted(by_order)  # each order exactly once
    assert all(by_order[o] == (f, s) for o, f, s in shipped)
    assert len(inbox) == len(by_order)
    assert {r["status"] for r in inbox} == {"applied"}


def test_a_producer_killed_mid_append_loses_nothing_committed(tmp_path):
    p, c = tmp_path / "orders.db", tmp_path / "shipping.db"
    # Three kills at different points of the loop, each resumed by the next
    # process from the orders already there.
    resume = PRODUCE.replace("order = 0", 'order = p.query("SELECT coalesce(max(id), 0) FROM orders")[0][0]')
    acknowledged = 0
    for lines in (40, 90, 150):
        seen = kill_after(resume, [p], lines)
        acknowledged = max(acknowledged, int(seen[-1]))
        check_produced(p, acknowledged)
    relayed, applied = map(int, run(RECOVER, p, c).split())
    orders, by_order = check_produced(p, acknowledged)
    assert relayed == applied == len(orders)
    check_shipped(c, by_order)
    # A second recovery finds nothing to do.
    assert run(RECOVER, p, c).split() == ["0", "0"]


def test_an_applier_killed_mid_batch_applies_nothing_twice(tmp_path):
    p, c = tmp_path / "orders.db", tmp_path / "shipping.db"
    seen = kill_after(PRODUCE, [p], 100)
    orders, by_order = check_produced(p, int(seen[-1]))
    # Relay only: the applier below finds everything received.
    run(COMMON + "ordo.relay(producer(sys.argv[1]), consumer(sys.argv[2]))", p, c)
    handled = kill_after(APPLY_SLOWLY, [c, 64], 100)
    assert "done" not in handled
    with ordo.Consumer.open(c, domain="shipping", migrations=SHIPMENTS) as store:
        shipped = {(f, s) for f, s in store.query("SELECT flow, seq FROM shipments")}
        applied = {(r["flow_id"], r["seq"]) for r in store.inbox(status="applied")}
    # What committed before the kill committed whole: the shipments and the
    # inbox's applied marks together; the batch in progress left nothing.
    assert shipped == applied
    assert len(applied) < len(handled) <= len(by_order), (len(applied), len(handled))
    relayed, recovered = map(int, run(RECOVER, p, c).split())
    assert relayed == 0 and recovered == len(by_order) - len(applied)
    check_shipped(c, by_order)
