"""The example python/examples/orders_shipping.py runs to its end."""

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "orders_shipping.py"


def test_orders_shipping_example(tmp_path):
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "stores"), "4"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for i in range(1, 5):
        assert f"orders: placed order-{i}" in lines
        assert f"shipping: shipped order-{i} ({1000 * i} cents)" in lines
        assert f"shipping: notify order-{i} succeeded {{'message_id': 'msg-order-{i}'}}" in lines
    assert (
        "shipping: blocked order-lost seq 1: unknown_event_type (no handler for order_misplaced)"
        in lines
    )
    assert "notifications sent: 4" in lines
    assert "runner: relayed 5, applied 4, effects succeeded 4" in lines
    assert "orders status: backlog 0" in lines
    assert "shipping status: applied 4, blocked 1" in lines
    assert (tmp_path / "stores" / "orders.db").exists()
