"""ordo.relay and runner.relay over HTTP, against a real `ordo serve`:
unsigned on loopback, signed with a key of a key file, refused with a
wrong key, a key bound to another producer refused before sending."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import ordo
from conftest import place

ROOT = Path(__file__).resolve().parents[2]
ORDO = Path(os.environ.get("ORDO_BIN", ROOT / "target" / "debug" / "ordo"))

pytestmark = pytest.mark.skipif(
    not ORDO.exists(), reason=f"{ORDO} is not built (cargo build -p ordo-cli)"
)

SECRET = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
OTHER = "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f"


class Served:
    """A running `ordo serve --consumer C --listen 127.0.0.1:0`."""

    def __init__(self, consumer, *extra):
        self.process = subprocess.Popen(
            [str(ORDO), "serve", "--consumer", str(consumer), "--listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.process.kill()
            raise AssertionError(f"first line {line!r}, stderr {self.process.stderr.read()!r}")
        self.url = "http://" + line.split()[-1]

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture
def served(tmp_path, shipping):
    started = []

    def start(*extra):
        s = Served(tmp_path / "shipping.db", *extra)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def key_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_relay_over_http_unsigned_on_loopback(orders, shipping, served):
    server = served()
    place(orders, "o-1", 10)
    place(orders, "o-2", 20)
    report = ordo.relay(orders, url=server.url)
    assert report.deliveries_total == 2
    assert [d["receipt"] for d in report.deliveries] == ["accepted", "accepted"]
    assert report.stop == "drained"
    assert orders.status()["backlog"] == 0
    assert [(r["flow_id"], r["status"]) for r in shipping.inbox()] == [
        ("o-1", "pending"),
        ("o-2", "pending"),
    ]
    assert shipping.inbox()[0]["store_id"] == orders.status()["store_id"]
    again = ordo.relay(orders, url=server.url)
    assert again.deliveries_total == 0


def test_relay_over_http_signed_with_a_key(orders, shipping, served, tmp_path):
    keys = key_file(tmp_path, "server.keys", f"k1 {SECRET}\n")
    server = served("--keys", keys)
    place(orders, "o-1", 10)
    with pytest.raises(ordo.Error, match="401"):
        ordo.relay(orders, url=server.url)
    assert shipping.inbox() == [], "an unsigned request is refused"
    wrong = key_file(tmp_path, "wrong.keys", f"k1 {OTHER}\n")
    with pytest.raises(ordo.Error, match="401"):
        ordo.relay(orders, url=server.url, key_id="k1", key_file=wrong)
    assert shipping.inbox() == []
    report = ordo.relay(orders, url=server.url, key_id="k1", key_file=keys)
    assert [d["receipt"] for d in report.deliveries] == ["accepted"]
    assert [r["flow_id"] for r in shipping.inbox()] == ["o-1"]


def test_key_arguments_are_checked_before_anything_is_sent(orders, shipping, served, tmp_path):
    keys = key_file(tmp_path, "client.keys", f"k1 {SECRET} producer=billing\n")
    server = served()
    place(orders, "o-1", 10)
    with pytest.raises(ordo.InvalidInput, match="bound to producer billing"):
        ordo.relay(orders, url=server.url, key_id="k1", key_file=keys)
    with pytest.raises(ordo.InvalidInput):
        ordo.relay(orders, url=server.url, key_id="k2", key_file=keys)
    with pytest.raises(ordo.InvalidInput):
        ordo.relay(orders, url=server.url, key_id="k1", key_file=str(tmp_path / "missing"))
    with pytest.raises(TypeError):
        ordo.relay(orders, url=server.url, key_id="k1")
    with pytest.raises(TypeError):
        ordo.relay(orders, shipping, key_id="k1", key_file=keys)
    with pytest.raises(TypeError):
        ordo.relay(orders)
    assert orders.status()["backlog"] == 1
    assert shipping.inbox() == []


def test_runner_relays_over_http_while_serve_receives(orders, shipping, served, tmp_path):
    keys = key_file(tmp_path, "server.keys", f"k1 {SECRET}\n")
    server = served("--keys", keys)
    applied = []

    def ship(tx, event):
        applied.append(event.flow_id)
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, event.payload["total"]))

    with ordo.Runner() as runner:
        runner.relay(orders, url=server.url, key_id="k1", key_file=keys)
        runner.apply(shipping, ship)
        for i in range(3):
            place(orders, f"o-{i}", i)
        deadline = time.monotonic() + 20
        while len(applied) < 3:
            assert time.monotonic() < deadline, applied
            runner.wait(timeout=0.05)
        report = runner.stop()
    assert applied == ["o-0", "o-1", "o-2"]
    assert report.relay["accepted"] == 3
    assert server.stop() == 0


def test_relay_in_process_to_a_named_destination(orders, shipping, tmp_path):
    out = subprocess.run(
        [str(ORDO), "destination", "add", "--producer", str(tmp_path / "orders.db"), "audit"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    audit = ordo.Consumer.open(tmp_path / "audit.db", domain="audit")
    place(orders, "o-1", 10)
    with pytest.raises(ordo.Error):
        ordo.relay(orders, shipping)  # two destinations: which one?
    report = ordo.relay(orders, audit, destination="audit")
    assert report.deliveries_total == 1
    assert orders.status()["destinations"]["audit"]["backlog"] == 0
    assert orders.status()["destinations"]["default"]["backlog"] == 1
    report = ordo.relay(orders, shipping, destination="default")
    assert report.deliveries_total == 1
    with pytest.raises(ordo.InvalidInput):
        ordo.relay(orders, shipping, destination="nowhere")
    audit.close()
