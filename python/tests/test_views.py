"""The views as dicts with the command line's JSON keys: store.status(),
consumer.inbox(status=None), consumer.effects(state=None), checked
against `ordo status --json`, `ordo inbox list --json` and `ordo effects
list --json` run on the same files."""

import json
import os
import subprocess
from pathlib import Path

import pytest

import ordo
from conftest import place

ROOT = Path(__file__).resolve().parents[2]
ORDO = Path(os.environ.get("ORDO_BIN", ROOT / "target" / "debug" / "ordo"))

needs_cli = pytest.mark.skipif(
    not ORDO.exists(), reason=f"{ORDO} is not built (cargo build -p ordo-cli)"
)


def cli(*args):
    out = subprocess.run(
        [str(ORDO), "--json", *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout)


def ship(tx, event):
    if event.type != "order_placed":
        return ordo.Block("unknown_event_type", f"no handler for {event.type}")
    tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, event.payload["total"]))
    tx.effect("notify", {"order": event.flow_id, "total": event.payload["total"]})


def without_ages(value):
    """The status without what moves with the clock."""
    if isinstance(value, dict):
        return {
            k: without_ages(v)
            for k, v in value.items()
            if k not in ("oldest_pending_age_s", "waiting_s")
        }
    if isinstance(value, list):
        return [without_ages(v) for v in value]
    return value


def test_producer_status_counts_the_backlog_until_relayed(orders, shipping):
    status = orders.status()
    assert status["backlog"] == 0
    assert status["oldest_pending_age_s"] is None
    assert status["producer_name"] == "orders"
    place(orders, "o-1", 10)
    place(orders, "o-2", 20)
    status = orders.status()
    assert status["backlog"] == 2
    assert status["oldest_pending_age_s"] >= 0
    assert set(status) == {
        "store_id",
        "backlog",
        "oldest_pending_age_s",
        "quarantined",
        "rewound",
        "backing_off",
        "producer_name",
        "destinations",
    }
    assert list(status["destinations"]) == ["default"]
    assert status["destinations"]["default"]["backlog"] == 2
    ordo.relay(orders, shipping)
    assert orders.status()["backlog"] == 0


def test_consumer_status_inbox_and_effects_as_the_cli_prints_them(orders, shipping, tmp_path):
    place(orders, "o-1", 10)
    place(orders, "o-2", 20)
    place(orders, "o-3", 30, event_type="order_cancelled")
    ordo.relay(orders, shipping)
    status = shipping.status()
    assert status["pending"] == 3
    assert status["applied"] == 0
    shipping.apply(ship)
    status = shipping.status()
    assert status["pending"] == 0
    assert status["applied"] == 2
    assert status["blocked"] == {"total": 1, "by_reason": {"unknown_event_type": 1}}
    assert status["effects"]["pending"] == 2
    assert status["effects"]["succeeded"] == 0

    inbox = shipping.inbox()
    assert [(r["flow_id"], r["seq"], r["status"]) for r in inbox] == [
        ("o-1", 1, "applied"),
        ("o-2", 1, "applied"),
        ("o-3", 1, "blocked"),
    ]
    blocked = shipping.inbox(status="blocked")
    assert [r["flow_id"] for r in blocked] == ["o-3"]
    assert blocked[0]["reason"] == "unknown_event_type"
    assert blocked[0]["detail"] == "no handler for order_cancelled"
    assert blocked[0]["payload"] == {"total": 30}
    assert [r["flow_id"] for r in shipping.inbox(status="applied")] == ["o-1", "o-2"]
    assert shipping.inbox(status="pending") == []
    assert len(shipping.inbox(limit=1)) == 1

    effects = shipping.effects()
    assert [(e["flow_id"], e["name"], e["state"]) for e in effects] == [
        ("o-1", "notify", "pending"),
        ("o-2", "notify", "pending"),
    ]
    assert effects[0]["request"] == {"order": "o-1", "total": 10}
    assert effects[0]["result"] is None
    assert effects[0]["attempts"] == 0
    assert shipping.effects(state="succeeded") == []
    assert len(shipping.effects(state="pending", name="notify")) == 2

    if ORDO.exists():
        db = str(tmp_path / "shipping.db")
        assert cli("inbox", "list", "--consumer", db)["inbox"] == inbox
        assert cli("inbox", "list", "--consumer", db, "--blocked")["inbox"] == blocked
        assert cli("effects", "list", "--consumer", db)["effects"] == effects
        printed = cli("status", "--consumer", db)["consumer"]
        assert without_ages(printed) == without_ages(shipping.status())
        printed = cli("status", "--producer", str(tmp_path / "orders.db"))["producer"]
        assert without_ages(printed) == without_ages(orders.status())


def test_bad_filters_are_refused(shipping):
    with pytest.raises(ordo.InvalidInput):
        shipping.inbox(status="done")
    with pytest.raises(ordo.InvalidInput):
        shipping.effects(state="done")
    with pytest.raises(ordo.InvalidInput):
        shipping.effects(name="Not A Name")
    with pytest.raises(TypeError):
        shipping.inbox(status=3)


def test_views_of_a_closed_store_raise(orders, shipping):
    shipping.close()
    orders.close()
    with pytest.raises(ordo.Error):
        shipping.status()
    with pytest.raises(ordo.Error):
        shipping.inbox()
    with pytest.raises(ordo.Error):
        orders.status()


def test_status_inside_a_transaction_of_the_same_thread_is_refused(orders):
    with orders.transaction() as tx:
        tx.append("o-1", "order_placed", {"total": 1})
        with pytest.raises(ordo.Error, match="already holds"):
            orders.status()
    assert orders.status()["backlog"] == 1
