"""Orders and shipping, each with its own SQLite file, in Python.

The orders service places an order and publishes `order_placed` in the
same transaction; the runner relays it to shipping's inbox, shipping's
handler creates the shipment and records a `notify` effect in the same
transaction, and the effects loop sends the notification, once, with the
intent's key for the provider's deduplication. An event shipping does not
know is blocked, not lost.

    python examples/orders_shipping.py [DIR] [N]

keeps the files in DIR (a temporary folder by default) and places N orders
(default 3). It prints what each service did, then the stores' status.
"""

import sys
import tempfile
import threading
import time
from pathlib import Path

import ordo

ORDERS = ["CREATE TABLE orders (order_id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)"]
SHIPPING = [
    "CREATE TABLE shipments (order_id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)",
]

# The notification provider: it deduplicates by the key it is given.
sent = {}
sent_lock = threading.Lock()


def place(orders, order_id, total_cents, event_type="order_placed"):
    """The order and its event, committed together."""
    with orders.transaction() as tx:
        tx.execute("INSERT INTO orders VALUES (?, ?)", (order_id, total_cents))
        tx.append(order_id, event_type, {"total_cents": total_cents})


def ship(tx, event):
    """Shipping's handler: inside the apply transaction."""
    if event.type != "order_placed":
        return ordo.Block("unknown_event_type", f"no handler for {event.type}")
    total = event.payload["total_cents"]
    tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, total))
    tx.effect("notify", {"order": event.flow_id, "total_cents": total})
    return ordo.APPLY


def notify(effect):
    """The effect: the provider's call, keyed for its deduplication."""
    with sent_lock:
        sent.setdefault(effect.key, effect.request)
    return {"message_id": f"msg-{effect.request['order']}"}


def find_notification(effect):
    """Asked when a call's outcome is unknown: did the provider get it?"""
    with sent_lock:
        if effect.key in sent:
            return {"message_id": f"msg-{effect.request['order']}"}
    raise ordo.Retry("not sent")


def main(folder, n):
    orders = ordo.Producer.open(folder / "orders.db", domain="orders", name="orders", migrations=ORDERS)
    shipping = ordo.Consumer.open(folder / "shipping.db", domain="shipping", migrations=SHIPPING)
    with orders, shipping, ordo.Runner() as runner:
        runner.relay(orders, shipping)
        runner.apply(shipping, ship)
        runner.effects(
            shipping,
            {"notify": notify},
            reconcile={"notify": find_notification},
            policy={"notify": ordo.EffectPolicy(max_attempts=8, dedup_window_s=None, ordered=True)},
        )
        for i in range(1, n + 1):
            place(orders, f"order-{i}", 1000 * i)
            print(f"orders: placed order-{i}")
        place(orders, "order-lost", 1, event_type="order_misplaced")
        print("orders: published order_misplaced for order-lost")

        deadline = time.monotonic() + 30
        while shipping.status()["effects"]["succeeded"] < n or shipping.status()["blocked"]["total"] < 1:
            if time.monotonic() > deadline:
                print("shipping did not catch up in 30 s", file=sys.stderr)
                return 1
            runner.wait(timeout=0.05)
        report = runner.stop()

        for order_id, total in shipping.query("SELECT order_id, total_cents FROM shipments ORDER BY order_id"):
            print(f"shipping: shipped {order_id} ({total} cents)")
        for row in shipping.inbox(status="blocked"):
            print(f"shipping: blocked {row['flow_id']} seq {row['seq']}: {row['reason']} ({row['detail']})")
        for effect in shipping.effects():
            print(f"shipping: notify {effect['flow_id']} {effect['state']} {effect['result']}")
        print(f"notifications sent: {len(sent)}")
        print(
            f"runner: relayed {report.relay['delivered']}, applied {report.apply['applied']}, "
            f"effects succeeded {report.effects['succeeded']}"
        )
        print(f"orders status: backlog {orders.status()['backlog']}")
        status = shipping.status()
        print(f"shipping status: applied {status['applied']}, blocked {status['blocked']['total']}")
    return 0


if __name__ == "__main__":
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if len(sys.argv) > 1:
        folder = Path(sys.argv[1])
        folder.mkdir(parents=True, exist_ok=True)
        sys.exit(main(folder, n))
    with tempfile.TemporaryDirectory() as folder:
        sys.exit(main(Path(folder), n))
