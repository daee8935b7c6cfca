import math
import threading

import pytest

import ordo
from conftest import place


def test_append_allocates_seq_and_id(orders):
    first = place(orders, "o-1", 4999)
    assert isinstance(first, ordo.Envelope)
    assert (first.flow_id, first.seq, first.type, first.schema_version) == ("o-1", 1, "order_placed", 1)
    assert first.payload == {"total": 4999}
    assert first.producer == "orders"
    assert first.event_id == "o-1-1"
    assert first.headers == {}
    with orders.transaction() as tx:
        second = tx.append("o-1", "order_paid", {"at": "now"}, schema_version=2,
                           headers={"correlation": "c-1"})
        third = tx.append("o-1", "order_shipped", {})
        other = tx.append("o-2", "order_placed", {"nested": {"list": [1, 2.5, None, True]}})
    assert (second.seq, third.seq, other.seq) == (2, 3, 1)
    assert second.schema_version == 2 and second.headers == {"correlation": "c-1"}
    assert other.payload == {"nested": {"list": [1, 2.5, None, True]}}
    assert orders.query("SELECT flow_id, seq, type FROM outbox ORDER BY position") == [
        ("o-1", 1, "order_placed"), ("o-1", 2, "order_paid"),
        ("o-1", 3, "order_shipped"), ("o-2", 1, "order_placed"),
    ]
    assert orders.query("SELECT id, total FROM orders") == [("o-1", 4999)]


def test_an_exception_rolls_back_everything(orders):
    with pytest.raises(RuntimeError):
        with orders.transaction() as tx:
            tx.execute("INSERT INTO orders VALUES (?, ?)", ("o-1", 1))
            tx.append("o-1", "order_placed", {})
            raise RuntimeError("changed my mind")
    assert orders.query("SELECT count(*) FROM orders") == [(0,)]
    assert orders.query("SELECT count(*) FROM outbox") == [(0,)]
    # The flow's seq was not used: the next append is seq 1 again.
    assert place(orders, "o-1", 2).seq == 1


def test_rows_and_values_round_trip(orders):
    with orders.transaction() as tx:
        tx.execute("CREATE TABLE v (a, b, c, d, e)")
        assert tx.execute("INSERT INTO v VALUES (?, ?, ?, ?, ?)", [None, 2**63 - 1, 1.5, "t", b"\x00b"]) == 1
        assert tx.query("SELECT * FROM v") == [(None, 2**63 - 1, 1.5, "t", b"\x00b")]
        assert tx.execute("UPDATE v SET a = 1") == 1
    assert orders.query("SELECT a FROM v WHERE c > ?", (1,)) == [(1,)]


def test_a_failed_statement_leaves_the_transaction_usable(orders):
    with orders.transaction() as tx:
        tx.execute("INSERT INTO orders VALUES ('o-1', 1)")
        with pytest.raises(ordo.Error):
            tx.execute("INSERT INTO orders VALUES ('o-1', 2)")
        with pytest.raises(ordo.Error):
            tx.execute("SELEC nonsense")
        tx.append("o-1", "order_placed", {})
    assert orders.query("SELECT id, total FROM orders") == [("o-1", 1)]
    assert orders.query("SELECT count(*) FROM outbox") == [(1,)]


def test_store_query_does_not_wait_for_an_open_transaction(orders):
    place(orders, "o-1", 1)
    with orders.transaction() as tx:
        tx.execute("INSERT INTO orders VALUES ('o-2', 2)")
        # Another thread's read returns at once, with the committed rows.
        seen = []
        reader = threading.Thread(target=lambda: seen.append(orders.query("SELECT id FROM orders")))
        reader.start()
        reader.join(timeout=10)
        assert seen == [[("o-1",)]]
    assert orders.query("SELECT count(*) FROM orders") == [(2,)]


def test_nested_finished_and_closed_raise_error(tmp_path):
    store = ordo.Producer.open(str(tmp_path / "p.db"), domain="orders")
    with store.transaction() as tx:
        with pytest.raises(ordo.Error):
            store.transaction()
        tx.append("f", "t", {})
    with pytest.raises(ordo.Error):
        tx.append("f", "t", {})
    with pytest.raises(ordo.Error):
        tx.execute("SELECT 1")
    with pytest.raises(ordo.Error):
        tx.commit()
    # A transaction rolled back explicitly, then the block ends quietly.
    with store.transaction() as tx:
        tx.append("f", "t", {})
        tx.rollback()
    assert store.query("SELECT count(*) FROM outbox") == [(1,)]
    # A dropped transaction rolls back and frees the store.
    tx = store.transaction()
    tx.append("g", "t", {})
    del tx
    with store.transaction() as tx:
        assert tx.append("g", "t", {}).seq == 1
    store.close()
    assert store.closed
    store.close()
    for use in [store.transaction, lambda: store.query("SELECT 1")]:
        with pytest.raises(ordo.Error):
            use()
    with ordo.Producer.open(str(tmp_path / "p.db"), domain="orders") as again:
        assert again.query("SELECT count(*) FROM outbox") == [(2,)]
    assert again.closed


def test_bad_appends_write_nothing(orders):
    cases = [
        (("o-1", "t", [1, 2]), TypeError),
        (("o-1", "t", "text"), TypeError),
        (("o-1", "t", {"x": object()}), TypeError),
        (("o-1", "t", {"x": {1, 2}}), TypeError),
        (("o-1", "t", {1: "non-str key"}), TypeError),
        (("o-1", "t", {"x": math.nan}), ordo.InvalidInput),
        (("o-1", "t", {"x": math.inf}), ordo.InvalidInput),
        (("o-1", "t", {"x": 2**64}), ordo.InvalidInput),
        (("o-1", "t", {"x": -(2**63) - 1}), ordo.InvalidInput),
        (("", "t", {}), ordo.InvalidInput),
        (("o/1", "t", {}), ordo.InvalidInput),
        (("o-1", "", {}), ordo.InvalidInput),
        (("o-1", "t" * 101, {}), ordo.InvalidInput),
        ((1, "t", {}), TypeError),
        (("o-1", None, {}), TypeError),
    ]
    with orders.transaction() as tx:
        for args, error in cases:
            with pytest.raises(error):
                tx.append(*args)
        with pytest.raises(ordo.InvalidInput):
            tx.append("o-1", "t", {}, schema_version=0)
        with pytest.raises(TypeError):
            tx.append("o-1", "t", {}, schema_version="1")
        with pytest.raises(TypeError):
            tx.append("o-1", "t", {}, headers={"k": 1})
        with pytest.raises(TypeError):
            tx.execute("SELECT ?", (object(),))
        with pytest.raises(TypeError):
            tx.execute("SELECT ?", "not a tuple")
        with pytest.raises(ordo.InvalidInput):
            tx.execute("SELECT ?", (2**63,))
        with pytest.raises(ordo.InvalidInput):
            tx.execute("SELECT ?", (math.nan,))
        # Still usable after every refusal: 2**64-1 is a JSON integer.
        event = tx.append("o-1", "t", {"big": 2**64 - 1, "small": -(2**63)})
    assert event.seq == 1 and event.payload == {"big": 2**64 - 1, "small": -(2**63)}
    assert orders.query("SELECT count(*) FROM outbox") == [(1,)]


def test_eight_threads_append_contiguous_seqs(orders):
    flows, per_thread, threads_n = 4, 50, 8
    errors = []

    def work(k):
        try:
            for i in range(per_thread):
                with orders.transaction() as tx:
                    tx.append(f"flow-{(k + i) % flows}", "tick", {"thread": k, "i": i})
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    rows = orders.query("SELECT flow_id, seq, body FROM outbox ORDER BY flow_id, seq")
    assert len(rows) == threads_n * per_thread
    for f in range(flows):
        seqs = [seq for flow_id, seq, _ in rows if flow_id == f"flow-{f}"]
        assert seqs == list(range(1, len(seqs) + 1))
    seen = {(k, i) for k in range(threads_n) for i in range(per_thread)}
    import json
    assert {(json.loads(b)["payload"]["thread"], json.loads(b)["payload"]["i"]) for _, _, b in rows} == seen
