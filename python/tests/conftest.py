import pytest

import ordo


@pytest.fixture
def orders(tmp_path):
    store = ordo.Producer.open(
        str(tmp_path / "orders.db"),
        domain="orders",
        name="orders",
        migrations=["CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)"],
    )
    yield store
    store.close()


@pytest.fixture
def shipping(tmp_path):
    store = ordo.Consumer.open(
        tmp_path / "shipping.db",
        domain="shipping",
        migrations=["CREATE TABLE shipments (order_id TEXT PRIMARY KEY, total INTEGER)"],
    )
    yield store
    store.close()


def place(orders, order_id, total, event_type="order_placed"):
    with orders.transaction() as tx:
        tx.execute("INSERT INTO orders VALUES (?, ?)", (order_id, total))
        return tx.append(order_id, event_type, {"total": total})
