"""The same API on PostgreSQL: `?` placeholders rewritten, values converted
to the declared types. Needs a server at ORDO_TEST_PG (default
postgres://postgres@127.0.0.1:5432), and skips without one."""

import os
import shutil
import subprocess
import uuid

import pytest

import ordo

SERVER = os.environ.get("ORDO_TEST_PG", "postgres://postgres@127.0.0.1:5432")


def psql(sql):
    return subprocess.run(["psql", f"{SERVER}/postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture
def database():
    if shutil.which("psql") is None or psql("SELECT 1").returncode != 0:
        pytest.skip(f"no PostgreSQL server at {SERVER}")
    name = "ordo_py_" + uuid.uuid4().hex[:12]
    created = psql(f"CREATE DATABASE {name}")
    assert created.returncode == 0, created.stderr
    yield f"{SERVER}/{name}"
    psql(f"DROP DATABASE {name} WITH (FORCE)")


def test_orders_to_shipping_on_postgres(database):
    orders = ordo.Producer.open(database, domain="orders", name="orders", migrations={
        "sqlite": ["CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER, data TEXT)"],
        "postgres": ["CREATE TABLE orders (id TEXT PRIMARY KEY, total INT4, data JSONB)"],
    })
    shipping = ordo.Consumer.open(database, domain="shipping",
                                  migrations=["CREATE TABLE shipments (order_id TEXT PRIMARY KEY, total BIGINT)"])
    with orders.transaction() as tx:
        assert tx.execute("INSERT INTO orders VALUES (?, ?, ?)", ("o-1", 4999, '{"k": "?"}')) == 1
        assert tx.query("SELECT id, total, data, '?' FROM orders WHERE id = ?", ("o-1",)) == [
            ("o-1", 4999, {"k": "?"}, "?")]
        event = tx.append("o-1", "order_placed", {"total": 4999})
        assert (event.seq, event.producer) == (1, "orders")
    with pytest.raises(RuntimeError):
        with orders.transaction() as tx:
            tx.append("o-1", "order_paid", {})
            raise RuntimeError
    assert orders.query("SELECT count(*) FROM orders") == [(1,)]
    assert ordo.relay(orders, shipping).deliveries_total == 1

    def ship(tx, event):
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, event.payload["total"]))
        tx.effect("notify", {"order": event.flow_id})

    assert shipping.apply(ship).flows[0]["applied"] == 1
    assert shipping.query("SELECT order_id, total FROM shipments") == [("o-1", 4999)]
    with pytest.raises(ordo.WrongDomain):
        ordo.Consumer.open(database, domain="billing")
    orders.close()
    shipping.close()
