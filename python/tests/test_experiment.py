"""The original experiment's tests (the Python standard-library seed),
re-stated against ``import ordo``: one test per behaviour, with the same
intent, on real SQLite files.

The seed's tests handed the consumer hand-made envelopes through its
``receive``. The binding has no ``receive``: ``deliver`` below hands an
envelope over through ``ordo.relay`` from a scratch producer store (named
``default``, like every store here) that holds that one event, so that
each arrives through the same relay and receive as any other.
"""

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest

import ordo
import ordo.reservation as reservation

STEPS = ["reserved", "confirmed", "released"]
QUANTITY = 5
_scratch = itertools.count()


@pytest.fixture
def p(tmp_path):
    store = ordo.Producer.open(tmp_path / "producer.db", domain="reservation")
    yield store
    store.close()


@pytest.fixture
def c(tmp_path):
    store = ordo.Consumer.open(tmp_path / "consumer.db", domain="reservation")
    yield store
    store.close()


def produce(p, flow, steps, quantity=QUANTITY):
    for seq in range(steps):
        assert reservation.advance(p, flow, seq, STEPS[seq], quantity=quantity) == "committed"


def deliver(tmp_path, c, flow, seq, type, payload, schema_version=1, event_id=None):
    """Hands ``c`` exactly this envelope and returns the relay's delivery.

    A scratch producer store appends the flow's events up to ``seq`` and
    keeps the last alone (with ``event_id`` when given), so that the relay
    hands over that event and nothing else."""
    with ordo.Producer.open(tmp_path / f"scratch-{next(_scratch)}.db", domain="reservation") as scratch:
        with scratch.transaction() as tx:
            for _ in range(seq):
                tx.append(flow, type, payload, schema_version=schema_version)
            tx.execute("DELETE FROM custody WHERE position IN (SELECT position FROM outbox WHERE seq < ?)", (seq,))
            tx.execute("DELETE FROM outbox WHERE seq < ?", (seq,))
            tx.execute("UPDATE relay_head SET relay_seq = ?", (seq,))
            if event_id is not None:
                (body,) = tx.query("SELECT body FROM outbox")[0]
                body = json.loads(body)
                body["event_id"] = event_id
                tx.execute(
                    "UPDATE outbox SET event_id = ?, body = ?",
                    (event_id, json.dumps(body, sort_keys=True, separators=(",", ":"))),
                )
        report = ordo.relay(scratch, c)
    (delivery,) = report.deliveries
    return delivery


def consumer_rows(c):
    snap = reservation.snapshot(consumer=c)["consumer"]
    inbox = [(r["event_id"], r["seq"], r["status"], r["reason"]) for r in snap["inbox"]]
    projection = [(r["flow_id"], r["state"], r["quantity"], r["applied_seq"]) for r in snap["projection"]]
    effects = [(r["flow_id"], r["seq"], r["event_id"]) for r in snap["effects"]]
    return inbox, projection, effects


def flows(report):
    return [(f["flow_id"], f["applied"], f["stop"], f["reason"]) for f in report.flows]


def test_happy_path(p, c):
    produce(p, "a", 3)
    relayed = ordo.relay(p, c)
    assert [(d["event_id"], d["receipt"]) for d in relayed.deliveries] == [
        ("a-1", "accepted"),
        ("a-2", "accepted"),
        ("a-3", "accepted"),
    ]
    assert relayed.stop == "drained"
    assert flows(reservation.apply(c)) == [("a", 3, "idle", None)]
    snap = reservation.snapshot(p, c)
    assert snap["producer"]["flows"] == [{"flow_id": "a", "state": "released", "quantity": 5, "last_seq": 3}]
    assert all(e["accepted"] for e in snap["producer"]["outbox"])
    assert consumer_rows(c) == (
        [("a-1", 1, "applied", None), ("a-2", 2, "applied", None), ("a-3", 3, "applied", None)],
        [("a", "released", 5, 3)],
        [("a", 1, "a-1"), ("a", 2, "a-2"), ("a", 3, "a-3")],
    )


def test_duplicate_delivery_is_received_and_applied_once(tmp_path, p, c):
    produce(p, "a", 1)
    assert ordo.relay(p, c).deliveries[0]["receipt"] == "accepted"
    # The same event again (as after a lost acknowledgement): a duplicate.
    assert deliver(tmp_path, c, "a", 1, "reserved", {"amount": QUANTITY})["receipt"] == "duplicate"
    assert flows(reservation.apply(c)) == [("a", 1, "idle", None)]
    assert consumer_rows(c) == ([("a-1", 1, "applied", None)], [("a", "reserved", 5, 1)], [("a", 1, "a-1")])


@pytest.mark.parametrize(
    "forged",
    [
        dict(payload={"amount": QUANTITY + 1}),  # the same event id, another body
        dict(payload={"amount": QUANTITY}, event_id="other-1"),  # the same (flow, seq), another id
    ],
    ids=["same_event_id", "same_flow_seq"],
)
def test_conflict_changes_nothing(tmp_path, p, c, forged):
    produce(p, "a", 1)
    ordo.relay(p, c)
    before = reservation.snapshot(p, c)
    delivery = deliver(tmp_path, c, "a", 1, "reserved", **forged)
    assert (delivery["receipt"], delivery["cause"]) == ("conflict", "conflict")
    assert reservation.snapshot(p, c) == before
    assert consumer_rows(c) == ([("a-1", 1, "pending", None)], [], [])


def test_out_of_order_3_1_2_applies_in_seq_order(tmp_path, c):
    applies = []
    for seq in [3, 1, 2]:
        delivery = deliver(tmp_path, c, "a", seq, STEPS[seq - 1], {"amount": QUANTITY})
        assert (delivery["event_id"], delivery["receipt"]) == (f"a-{seq}", "accepted")
        applies.append(flows(reservation.apply(c)))
    assert applies == [
        [("a", 0, "gap", None)],
        [("a", 1, "gap", None)],
        [("a", 2, "idle", None)],
    ]
    inbox, projection, effects = consumer_rows(c)
    assert [status for (_, _, status, _) in inbox] == ["applied"] * 3
    assert projection == [("a", "released", 5, 3)]
    assert effects == [("a", 1, "a-1"), ("a", 2, "a-2"), ("a", 3, "a-3")]


def test_unknown_schema_is_kept_and_blocked(tmp_path, c):
    assert deliver(tmp_path, c, "x", 1, "reserved", {"amount": QUANTITY}, schema_version=9)["receipt"] == "accepted"
    assert flows(reservation.apply(c)) == [("x", 0, "blocked", "unsupported_schema")]
    assert flows(reservation.apply(c, support_v2=True)) == [("x", 0, "blocked", "unsupported_schema")]
    assert consumer_rows(c) == ([("x-1", 1, "blocked", "unsupported_schema")], [], [])
    (row,) = reservation.snapshot(consumer=c)["consumer"]["inbox"]
    assert (row["schema_version"], row["payload"]) == (9, {"amount": QUANTITY})


def test_schema_2_applies_once_enabled_with_the_same_id_and_seq(p, c):
    assert reservation.advance(p, "a", 0, "reserved", quantity=QUANTITY, schema_version=2) == "committed"
    ordo.relay(p, c)
    assert flows(reservation.apply(c)) == [("a", 0, "blocked", "unsupported_schema")]
    assert flows(reservation.apply(c, support_v2=True)) == [("a", 1, "idle", None)]
    assert consumer_rows(c) == ([("a-1", 1, "applied", None)], [("a", "reserved", 5, 1)], [("a", 1, "a-1")])
    (row,) = reservation.snapshot(consumer=c)["consumer"]["inbox"]
    assert (row["schema_version"], row["payload"]) == (2, {"units": QUANTITY})


def test_invalid_payload_is_kept_and_blocked(tmp_path, c):
    assert deliver(tmp_path, c, "x", 1, "reserved", {"amount": 1_000_001})["receipt"] == "accepted"
    assert flows(reservation.apply(c)) == [("x", 0, "blocked", "invalid_payload")]
    assert consumer_rows(c) == ([("x-1", 1, "blocked", "invalid_payload")], [], [])


def test_process_all_isolates_blocked_and_gapped_flows(tmp_path, p, c):
    deliver(tmp_path, c, "b", 1, "reserved", {"amount": QUANTITY}, schema_version=9)
    deliver(tmp_path, c, "g", 2, "confirmed", {"amount": QUANTITY})
    produce(p, "h", 3)
    ordo.relay(p, c)
    assert flows(reservation.apply(c)) == [
        ("b", 0, "blocked", "unsupported_schema"),
        ("g", 0, "gap", None),
        ("h", 3, "idle", None),
    ]
    inbox, projection, effects = consumer_rows(c)
    assert inbox[:2] == [("b-1", 1, "blocked", "unsupported_schema"), ("g-2", 2, "pending", None)]
    assert projection == [("h", "released", 5, 3)]
    assert [e[0] for e in effects] == ["h", "h", "h"]


def test_first_pending_relay_starves_behind_a_conflict_and_fair_does_not(tmp_path, p, c):
    produce(p, "a", 1)
    produce(p, "b", 1)
    deliver(tmp_path, c, "a", 1, "reserved", {"amount": QUANTITY + 1})  # the consumer holds another a-1
    for _ in range(3):
        run = ordo.relay(p, c, policy="first-pending")
        assert [(d["event_id"], d["receipt"]) for d in run.deliveries] == [("a-1", "conflict")]
    outbox = {e["event_id"]: e["accepted"] for e in reservation.snapshot(p)["producer"]["outbox"]}
    assert outbox == {"a-1": False, "b-1": False}  # b starves behind a
    # ordo's default policy holds back only the conflicting flow.
    run = ordo.relay(p, c)
    assert [(d["event_id"], d["receipt"]) for d in run.deliveries] == [("b-1", "accepted")]
    outbox = {e["event_id"]: (e["accepted"], e["destinations"]["default"]["quarantined"])
              for e in reservation.snapshot(p)["producer"]["outbox"]}
    assert outbox == {"a-1": (False, True), "b-1": (True, False)}
    assert [(e, s) for (e, _, s, _) in consumer_rows(c)[0]] == [("a-1", "pending"), ("b-1", "pending")]


# The wrong dual write: the flow's state and its event in two transactions,
# the process killed between them.
WRONG_DUAL_WRITE = textwrap.dedent(
    """
    import os, sys
    import ordo
    producer = ordo.Producer.open(sys.argv[1], domain="reservation")
    with producer.transaction() as tx:
        tx.execute("INSERT INTO flow (flow_id, state, quantity) VALUES ('a', 'reserved', 5)")
    os._exit(81)  # dies before the second transaction appends the event
    with producer.transaction() as tx:
        tx.append("a", "reserved", {"amount": 5})
    """
)


def test_the_wrong_dual_write_loses_the_event(tmp_path, c):
    path = str(tmp_path / "producer.db")
    run = subprocess.run([sys.executable, "-c", WRONG_DUAL_WRITE, path], capture_output=True, text=True)
    assert run.returncode == 81, run.stderr
    with ordo.Producer.open(path, domain="reservation") as p:
        assert ordo.relay(p, c).deliveries == []
        assert reservation.apply(c).flows == []
        snap = reservation.snapshot(p, c)
        # The state moved to reserved; no event exists to tell the consumer.
        assert snap["producer"]["flows"] == [{"flow_id": "a", "state": "reserved", "quantity": 5, "last_seq": 0}]
        assert snap["producer"]["outbox"] == []
        assert snap["consumer"]["inbox"] == [] and snap["consumer"]["projection"] == []
        # advance, the one-transaction write, sees last_seq 0 and moves on.
        assert reservation.advance(p, "a", 0, "confirmed") == "committed"


def test_the_bounds(p):
    assert reservation.advance(p, "q1", 0, "reserved", quantity=1) == "committed"
    assert reservation.advance(p, "q2", 0, "reserved", quantity=1_000_000) == "committed"
    for quantity in [0, -1, 1_000_001]:
        with pytest.raises(ordo.InvalidInput):
            reservation.advance(p, "q3", 0, "reserved", quantity=quantity)
    with pytest.raises(ordo.InvalidInput):
        reservation.advance(p, "q1", 1, "confirmed", quantity=2)  # a flow's quantity never changes
    longest = "f" * 100
    assert reservation.advance(p, longest, 0, "reserved", quantity=3) == "committed"
    for flow_id in ["f" * 101, "", "a b", "é", "a/b"]:
        with pytest.raises(ordo.InvalidInput):
            reservation.advance(p, flow_id, 0, "reserved", quantity=3)
    with pytest.raises(ordo.InvalidInput):
        reservation.advance(p, "s", -1, "reserved", quantity=3)
    with pytest.raises(ordo.InvalidInput):
        reservation.advance(p, "s", 2**63, "reserved", quantity=3)
    assert reservation.advance(p, "s", 2**63 - 1, "reserved", quantity=3) == "stale"
    # A flow whose seq reached 2^63-1 has no next seq: refused, nothing written.
    with p.transaction() as tx:
        tx.execute("INSERT INTO flow VALUES ('z', 'reserved', 3)")
        tx.execute("INSERT INTO outbox_head (flow_id, last_seq) VALUES ('z', ?)", (2**63 - 1,))
    with pytest.raises(ordo.InvalidInput, match="no seq is left"):
        reservation.advance(p, "z", 2**63 - 1, "confirmed")
    assert p.query("SELECT state FROM flow WHERE flow_id = 'z'") == [("reserved",)]
    # Nothing refused was written.
    assert sorted(f["flow_id"] for f in reservation.snapshot(p)["producer"]["flows"]) == [longest, "q1", "q2", "z"]
    assert os.path.exists(p.location)
