import json

import pytest

import ordo
from conftest import place


def ship(tx, event):
    if event.type != "order_placed":
        return ordo.Block("unknown_event_type", f"no handler for {event.type}")
    tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, event.payload["total"]))
    tx.effect("notify", {"order": event.flow_id, "total": event.payload["total"]})
    return None


def test_relay_then_apply(orders, shipping):
    place(orders, "o-1", 4999)
    place(orders, "o-2", 10)
    report = ordo.relay(orders, shipping)
    assert report.deliveries_total == 2 and report.stop == "drained"
    assert [d["receipt"] for d in report.to_dict()["deliveries"]] == ["accepted", "accepted"]
    assert ordo.relay(orders, shipping).deliveries_total == 0
    applied = shipping.apply(ship)
    assert applied.flows_total == 2
    assert {(f["flow_id"], f["applied"], f["stop"]) for f in applied.flows} == {("o-1", 1, "idle"), ("o-2", 1, "idle")}
    assert shipping.query("SELECT order_id, total FROM shipments ORDER BY order_id") == [("o-1", 4999), ("o-2", 10)]
    assert shipping.apply(ship).flows_total == 0
    effects = shipping.query("SELECT name, flow_id, seq, state, request FROM effect_intent ORDER BY flow_id")
    assert [(n, f, s, st) for n, f, s, st, _ in effects] == [
        ("notify", "o-1", 1, "pending"), ("notify", "o-2", 1, "pending")]
    assert json.loads(effects[0][4]) == {"order": "o-1", "total": 4999}


def test_block_stops_the_flow_with_its_code(orders, shipping):
    place(orders, "o-1", 1)
    with orders.transaction() as tx:
        tx.append("o-1", "order_teleported", {})
        tx.append("o-1", "order_placed", {"total": 2})
    ordo.relay(orders, shipping)
    report = shipping.apply(ship)
    (flow,) = report.flows
    assert (flow["applied"], flow["stop"], flow["reason"]) == (1, "blocked", "unknown_event_type")
    assert flow["detail"] == "no handler for order_teleported"
    assert shipping.query("SELECT count(*) FROM shipments") == [(1,)]
    assert shipping.query("SELECT seq, status FROM inbox ORDER BY seq") == [
        (1, "applied"), (2, "blocked"), (3, "pending")]


def test_a_raising_handler_rolls_back_and_raises_handler_error(orders, shipping):
    place(orders, "o-1", 1)
    ordo.relay(orders, shipping)

    def broken(tx, event):
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, 0))
        tx.effect("notify", {})
        raise KeyError("missing")

    with pytest.raises(ordo.HandlerError) as raised:
        shipping.apply(broken)
    assert isinstance(raised.value.__cause__, KeyError)
    assert shipping.query("SELECT count(*) FROM shipments") == [(0,)]
    assert shipping.query("SELECT count(*) FROM effect_intent") == [(0,)]
    assert shipping.query("SELECT status FROM inbox") == [("pending",)]
    # Nothing was marked: a working handler applies it afterwards.
    assert shipping.apply(ship).flows[0]["applied"] == 1


def test_base_exceptions_propagate_unchanged(orders, shipping):
    place(orders, "o-1", 1)
    ordo.relay(orders, shipping)

    def interrupted(tx, event):
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, 0))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        shipping.apply(interrupted)
    assert shipping.query("SELECT count(*) FROM shipments") == [(0,)]
    assert shipping.query("SELECT status FROM inbox") == [("pending",)]


def test_bad_verdicts_and_handlers(orders, shipping):
    place(orders, "o-1", 1)
    ordo.relay(orders, shipping)
    with pytest.raises(ordo.HandlerError) as raised:
        shipping.apply(lambda tx, event: "applied")
    assert isinstance(raised.value.__cause__, TypeError)
    with pytest.raises(TypeError):
        shipping.apply("not callable")
    kept = []

    def keeps_tx(tx, event):
        kept.append(tx)
        return ordo.APPLY

    assert shipping.apply(keeps_tx).flows[0]["applied"] == 1
    with pytest.raises(ordo.Error):
        kept[0].execute("SELECT 1")


def test_an_invalid_effect_fails_the_apply(orders, shipping):
    place(orders, "o-1", 1)
    ordo.relay(orders, shipping)

    def bad_effect(tx, event):
        tx.effect("Bad Name", {})

    with pytest.raises(ordo.HandlerError) as raised:
        shipping.apply(bad_effect)
    assert isinstance(raised.value.__cause__, ordo.InvalidInput)

    def bad_request(tx, event):
        tx.effect("notify", {"x": float("nan")})

    with pytest.raises(ordo.HandlerError) as raised:
        shipping.apply(bad_request)
    assert isinstance(raised.value.__cause__, ordo.InvalidInput)
    assert shipping.query("SELECT status FROM inbox") == [("pending",)]


def test_apply_inside_its_own_handler_is_refused(orders, shipping):
    place(orders, "o-1", 1)
    ordo.relay(orders, shipping)

    def reenters(tx, event):
        shipping.apply(ship)

    with pytest.raises(ordo.HandlerError) as raised:
        shipping.apply(reenters)
    assert isinstance(raised.value.__cause__, ordo.Error)
    assert shipping.apply(ship).flows[0]["applied"] == 1


def test_ctrl_c_during_an_apply_rolls_the_batch_back(orders, shipping):
    import os
    import signal
    import time

    for i in range(20):
        place(orders, f"o-{i:02}", i)
    ordo.relay(orders, shipping)
    calls = []

    def slow(tx, event):
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, 0))
        calls.append(event.flow_id)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)

    with pytest.raises(KeyboardInterrupt):
        shipping.apply(slow)
    assert 5 <= len(calls) < 20
    # One batch: nothing of it was kept.
    assert shipping.query("SELECT count(*) FROM shipments") == [(0,)]
    assert shipping.query("SELECT count(*) FROM inbox WHERE status = 'pending'") == [(20,)]
