"""ordo.reservation: the built-in reference domain from Python."""

import os
import json
import subprocess

import pytest

import ordo
import ordo.reservation as reservation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("ORDO_BIN", os.path.join(ROOT, "target", "debug", "ordo"))


@pytest.fixture
def stores(tmp_path):
    producer = ordo.Producer.open(tmp_path / "producer.db", domain="reservation")
    consumer = ordo.Consumer.open(tmp_path / "consumer.db", domain="reservation")
    yield producer, consumer
    producer.close()
    consumer.close()


def test_advance_returns_the_outcome_and_writes_the_flow_with_its_event(stores):
    producer, _ = stores
    assert reservation.advance(producer, "f-1", 0, "reserved", quantity=5) == "committed"
    assert reservation.advance(producer, "f-1", 0, "confirmed") == "stale"
    assert reservation.advance(producer, "f-1", 1, "released") == "invalid_transition"
    assert reservation.advance(producer, "f-1", 1, "confirmed", quantity=5) == "committed"
    assert producer.query("SELECT flow_id, state, quantity FROM flow") == [("f-1", "confirmed", 5)]
    snap = reservation.snapshot(producer)
    assert list(snap) == ["producer"]
    assert snap["producer"]["flows"] == [
        {"flow_id": "f-1", "state": "confirmed", "quantity": 5, "last_seq": 2}
    ]
    events = [(e["event_id"], e["type"], e["payload"], e["accepted"]) for e in snap["producer"]["outbox"]]
    assert events == [
        ("f-1-1", "reserved", {"amount": 5}, False),
        ("f-1-2", "confirmed", {"amount": 5}, False),
    ]


def test_apply_writes_projection_and_one_effect_per_event(stores):
    producer, consumer = stores
    for seq, step in enumerate(["reserved", "confirmed", "released"]):
        assert reservation.advance(producer, "f-1", seq, step, quantity=7) == "committed"
    ordo.relay(producer, consumer)
    report = reservation.apply(consumer)
    assert report.to_dict() == {
        "flows": [
            {"flow_id": "f-1", "producer": "default", "applied": 3, "stop": "idle", "reason": None, "detail": None}
        ],
        "flows_total": 1,
        "truncated": False,
    }
    snap = reservation.snapshot(consumer=consumer)["consumer"]
    assert snap["projection"] == [
        {"flow_id": "f-1", "producer": "default", "state": "released", "quantity": 7, "applied_seq": 3}
    ]
    assert [(e["seq"], e["event_id"]) for e in snap["effects"]] == [(1, "f-1-1"), (2, "f-1-2"), (3, "f-1-3")]
    assert [r["status"] for r in snap["inbox"]] == ["applied"] * 3
    assert reservation.apply(consumer).flows == []


def test_snapshot_is_the_command_lines_and_both_open_each_others_stores(tmp_path):
    p, c = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    # Stores made by the command line open from Python with domain="reservation".
    subprocess.run([CLI, "init", "--producer", p, "--consumer", c], check=True, capture_output=True)
    subprocess.run(
        [CLI, "advance", "--producer", p, "--flow", "a", "--expected-seq", "0", "--to", "reserved", "--quantity", "3"],
        check=True,
        capture_output=True,
    )
    with ordo.Producer.open(p, domain="reservation") as producer, ordo.Consumer.open(
        c, domain="reservation"
    ) as consumer:
        assert reservation.advance(producer, "a", 1, "confirmed") == "committed"
        assert reservation.advance(producer, "b", 0, "reserved", quantity=9, schema_version=2) == "committed"
        ordo.relay(producer, consumer)
        reservation.apply(consumer)
        ours = reservation.snapshot(producer, consumer)
    theirs = json.loads(
        subprocess.run(
            [CLI, "snapshot", "--json", "--producer", p, "--consumer", c], check=True, capture_output=True, text=True
        ).stdout
    )
    assert ours == theirs
    assert ours["consumer"]["inbox"][-1]["reason"] == "unsupported_schema"


def test_reservation_stores_take_no_migrations_and_other_domains_are_refused(tmp_path, stores):
    with pytest.raises(ordo.InvalidInput, match="no migrations"):
        ordo.Producer.open(tmp_path / "x.db", domain="reservation", migrations=["CREATE TABLE t (x)"])
    with pytest.raises(ordo.InvalidInput, match="no migrations"):
        ordo.Consumer.open(tmp_path / "y.db", domain="reservation", migrations={"sqlite": ["x"], "postgres": ["x"]})
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "y.db").exists()
    with ordo.Producer.open(tmp_path / "z.db", domain="reservation", migrations=[]) as empty:
        assert empty.domain == "reservation"
    orders = ordo.Producer.open(tmp_path / "orders.db", domain="orders")
    shipping = ordo.Consumer.open(tmp_path / "shipping.db", domain="shipping")
    with pytest.raises(ordo.WrongDomain):
        reservation.advance(orders, "a", 0, "reserved", quantity=1)
    with pytest.raises(ordo.WrongDomain):
        reservation.apply(shipping)
    with pytest.raises(ordo.WrongDomain):
        reservation.snapshot(orders)
    with pytest.raises(ordo.WrongDomain):
        ordo.Producer.open(tmp_path / "orders.db", domain="reservation")
    producer, _ = stores
    with pytest.raises(ordo.WrongDomain):
        ordo.Producer.open(producer.location, domain="orders")


def test_bad_arguments_raise_and_write_nothing(stores):
    producer, consumer = stores
    bad = [
        (TypeError, dict(flow_id=1, expected_seq=0, to="reserved", quantity=1)),
        (TypeError, dict(flow_id="a", expected_seq="0", to="reserved", quantity=1)),
        (TypeError, dict(flow_id="a", expected_seq=0, to="reserved", quantity=1.5)),
        (TypeError, dict(flow_id="a", expected_seq=True, to="reserved", quantity=1)),
        (ordo.InvalidInput, dict(flow_id="a", expected_seq=0, to="new", quantity=1)),
        (ordo.InvalidInput, dict(flow_id="a", expected_seq=0, to="cancelled", quantity=1)),
        (ordo.InvalidInput, dict(flow_id="a", expected_seq=0, to="reserved")),
        (ordo.InvalidInput, dict(flow_id="a", expected_seq=-1, to="reserved", quantity=1)),
        (ordo.InvalidInput, dict(flow_id="a", expected_seq=0, to="reserved", quantity=1, schema_version=3)),
        (ordo.InvalidInput, dict(flow_id="a b", expected_seq=0, to="reserved", quantity=1)),
    ]
    for error, kwargs in bad:
        with pytest.raises(error):
            reservation.advance(producer, **kwargs)
    with pytest.raises(TypeError):
        reservation.advance(consumer, "a", 0, "reserved", quantity=1)
    with pytest.raises(TypeError):
        reservation.apply(producer)
    with pytest.raises(ordo.InvalidInput, match="first-pending"):
        ordo.relay(producer, consumer, policy="newest-first")
    with pytest.raises(TypeError):
        ordo.relay(producer, consumer, policy=1)
    assert reservation.snapshot(producer)["producer"]["outbox"] == []
    with producer.transaction():
        with pytest.raises(ordo.Error, match="do not nest"):
            reservation.advance(producer, "a", 0, "reserved", quantity=1)
    producer.close()
    with pytest.raises(ordo.Error, match="closed"):
        reservation.advance(producer, "a", 0, "reserved", quantity=1)
    with pytest.raises(ordo.Error, match="closed"):
        reservation.snapshot(producer)
