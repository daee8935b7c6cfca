"""ordo.Runner: relay, apply and effects loops on threads, wait() and
stop(), a handler's exception out of stop() and wait()."""

import os
import shutil
import subprocess
import threading
import time
import uuid

import pytest

import ordo
from conftest import place


def until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def shipped(shipping):
    return shipping.query("SELECT order_id, total FROM shipments ORDER BY order_id")


def test_relay_and_apply_loops_ship_what_is_placed(orders, shipping):
    threads = set()

    def ship(tx, event):
        threads.add(threading.get_ident())
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, event.payload["total"]))

    place(orders, "o-1", 10)
    with ordo.Runner() as runner:
        runner.relay(orders, shipping)
        runner.apply(shipping, ship)
        until(lambda: len(shipped(shipping)) == 1)
        place(orders, "o-2", 20)  # while the loops run
        until(lambda: len(shipped(shipping)) == 2)
        assert runner.report().apply["applied"] == 2
        report = runner.stop()
    assert shipped(shipping) == [("o-1", 10), ("o-2", 20)]
    assert report.relay["delivered"] == 2
    assert report.relay["accepted"] == 2
    assert report.apply["applied"] == 2
    assert runner.stopped
    assert threading.get_ident() not in threads
    assert runner.stop().apply["applied"] == 2, "stopping again gives the same totals"


def test_a_handler_exception_ends_wait_as_handler_error(orders, shipping):
    def ship(tx, event):
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, 1))
        raise ValueError(f"cannot ship {event.flow_id}")

    place(orders, "o-1", 10)
    runner = ordo.Runner()
    runner.relay(orders, shipping)
    runner.apply(shipping, ship)
    with pytest.raises(ordo.HandlerError) as raised:
        runner.wait(timeout=20)
    assert isinstance(raised.value.__cause__, ValueError)
    assert str(raised.value.__cause__) == "cannot ship o-1"
    assert runner.stopped
    assert shipped(shipping) == [], "the batch was rolled back"
    assert [r["status"] for r in shipping.inbox()] == ["pending"]


def test_stop_raises_the_handler_error_and_the_with_block_too(orders, shipping):
    def ship(tx, event):
        raise RuntimeError("boom")

    place(orders, "o-1", 10)
    with pytest.raises(ordo.HandlerError) as raised:
        with ordo.Runner() as runner:
            runner.relay(orders, shipping)
            runner.apply(shipping, ship)
            until(lambda: runner.report().relay["delivered"] == 1)
            time.sleep(0.3)
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_returned_non_verdict_is_a_handler_error_with_type_error(orders, shipping):
    place(orders, "o-1", 10)
    runner = ordo.Runner()
    runner.relay(orders, shipping)
    runner.apply(shipping, lambda tx, event: 42)
    with pytest.raises(ordo.HandlerError) as raised:
        runner.wait(timeout=20)
    assert isinstance(raised.value.__cause__, TypeError)


def test_blocks_are_counted_and_do_not_stop_the_loop(orders, shipping):
    def ship(tx, event):
        if event.type != "order_placed":
            return ordo.Block("unknown_event_type")
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, 1))

    place(orders, "o-1", 10, event_type="order_lost")
    place(orders, "o-2", 20)
    with ordo.Runner() as runner:
        runner.relay(orders, shipping)
        runner.apply(shipping, ship)
        until(lambda: len(shipped(shipping)) == 1)
        assert runner.wait(timeout=0.2) is None
    assert shipping.status()["blocked"]["total"] == 1


def test_wait_times_out_and_a_stopped_runner_starts_nothing(orders, shipping):
    runner = ordo.Runner()
    start = time.monotonic()
    assert runner.wait(timeout=0.2) is None
    assert time.monotonic() - start >= 0.2
    runner.stop()
    with pytest.raises(ordo.Error, match="stopped"):
        runner.relay(orders, shipping)
    with pytest.raises(ordo.Error, match="stopped"):
        runner.apply(shipping, lambda tx, event: None)
    with pytest.raises(ordo.Error, match="stopped"):
        runner.wait(timeout=0)


def test_bad_arguments_are_refused(orders, shipping):
    with ordo.Runner() as runner:
        with pytest.raises(TypeError):
            runner.relay(orders)
        with pytest.raises(TypeError):
            runner.relay(orders, shipping, url="http://127.0.0.1:1")
        with pytest.raises(TypeError):
            runner.relay(orders, orders)
        with pytest.raises(TypeError):
            runner.relay(orders, url="http://127.0.0.1:1", key_id="k1")
        with pytest.raises(TypeError):
            runner.apply(shipping, "not callable")
        with pytest.raises(ordo.InvalidInput):
            runner.relay(orders, shipping, destination="Bad Name")
        with pytest.raises(ordo.InvalidInput):
            runner.relay(orders, shipping, destination="elsewhere")
        with pytest.raises(ordo.InvalidInput):
            runner.relay(orders, url="not a url")


def test_a_runner_dropped_without_stop_stops_its_loops(orders, shipping):
    place(orders, "o-1", 10)
    runner = ordo.Runner()
    runner.relay(orders, shipping)
    runner.apply(shipping, lambda tx, event: None)
    until(lambda: runner.report().apply["applied"] == 1)
    del runner
    place(orders, "o-2", 10)
    time.sleep(0.5)
    assert orders.status()["backlog"] == 1, "nothing relays any more"


def test_the_runner_with_effects_end_to_end(orders, shipping):
    sent = []

    def ship(tx, event):
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, event.payload["total"]))
        tx.effect("notify", {"order": event.flow_id})

    def notify(effect):
        sent.append(effect.request["order"])
        return {"ok": True}

    with ordo.Runner() as runner:
        runner.relay(orders, shipping)
        runner.apply(shipping, ship)
        runner.effects(shipping, {"notify": notify})
        for i in range(5):
            place(orders, f"o-{i}", i)
        until(lambda: shipping.status()["effects"]["succeeded"] == 5)
    assert sorted(sent) == [f"o-{i}" for i in range(5)]


SERVER = os.environ.get("ORDO_TEST_PG", "postgres://postgres@127.0.0.1:5432")


def psql(sql):
    return subprocess.run(["psql", f"{SERVER}/postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture
def database():
    if shutil.which("psql") is None or psql("SELECT 1").returncode != 0:
        pytest.skip(f"no PostgreSQL server at {SERVER}")
    name = "ordo_py_runner_" + uuid.uuid4().hex[:12]
    created = psql(f"CREATE DATABASE {name}")
    assert created.returncode == 0, created.stderr
    yield f"{SERVER}/{name}"
    psql(f"DROP DATABASE {name} WITH (FORCE)")


def test_the_runner_and_the_views_on_postgres(database):
    orders = ordo.Producer.open(database, domain="orders", name="orders",
                                migrations=["CREATE TABLE orders (id TEXT PRIMARY KEY, total BIGINT)"])
    shipping = ordo.Consumer.open(database, domain="shipping",
                                  migrations=["CREATE TABLE shipments (order_id TEXT PRIMARY KEY, total BIGINT)"])

    def ship(tx, event):
        if event.type != "order_placed":
            return ordo.Block("unknown_event_type")
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, event.payload["total"]))
        tx.effect("notify", {"order": event.flow_id})

    def notify(effect):
        if effect.flow_id == "o-2":
            raise ordo.Failed("no address")
        return {"sent": effect.key}

    with orders, shipping, ordo.Runner() as runner:
        runner.relay(orders, shipping)
        runner.apply(shipping, ship)
        runner.effects(shipping, {"notify": notify})
        place(orders, "o-1", 10)
        place(orders, "o-2", 20)
        place(orders, "o-3", 30, event_type="order_lost")
        until(lambda: sum(e["state"] in ("succeeded", "failed") for e in shipping.effects()) == 2)
        report = runner.stop()
        assert report.apply["applied"] == 2
        assert shipping.query("SELECT order_id, total FROM shipments ORDER BY order_id") == [
            ("o-1", 10), ("o-2", 20)]
        status = shipping.status()
        assert (status["applied"], status["blocked"]["total"]) == (2, 1)
        assert (status["effects"]["succeeded"], status["effects"]["failed"]) == (1, 1)
        assert [r["status"] for r in shipping.inbox()] == ["applied", "applied", "blocked"]
        effects = shipping.effects()
        assert effects[0]["result"] == {"sent": effects[0]["key"]}
        assert effects[1]["last_error"] == "no address"
        assert orders.status()["backlog"] == 0
