"""What ordo costs from Python, measured on this machine.

    python python/bench.py [--seconds 2] [--flows 2000] [--batch 256]
                           [--cli target/release/ordo] [--cli-flows 300] [--dir DIR]

Runs, each on fresh SQLite files in a temporary directory:

- appends from Python: ``tx.append`` in transactions of ``--batch``
  events, and one event per transaction (each about ``--seconds``);
- the seed-style pure-Python design on the same disk: the standard
  library's ``sqlite3``, WAL and ``synchronous=FULL``, one commit per event
  (read the flow, write it, insert the outbox row), as the original
  experiment's ``advance`` did;
- apply of the same ``3 * --flows`` reservation events in transactions of
  ``--batch``: with a trivial Python handler, with a Python handler doing
  the reference domain's work (read the projection, upsert it, insert the
  effect row) and with the built-in Rust handler (``ordo.reservation.apply``):
  the last two do the same SQL, so their difference per event is what the
  Python boundary costs (the envelope built as Python objects, the call,
  each statement through the binding);
- the same runs through the Rust command line, ``ordo bench --flows
  --cli-flows --batch --batch`` (its ``produce`` is ``advance``: it also
  reads and writes the flow row; its ``apply`` is the reference handler),
  batched and one event per transaction, in the same run, as ratios.

Prints a table, then one JSON document on its last line.
"""

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

# The installed package, not the source folder beside this script (which
# has no compiled module).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [entry for entry in sys.path if os.path.abspath(entry or ".") != HERE]

import ordo  # noqa: E402
import ordo.reservation as reservation  # noqa: E402

ROOT = os.path.dirname(HERE)
STEPS = ("reserved", "confirmed", "released")


def rate(events, seconds):
    return events / seconds if seconds > 0 else float("inf")


def appends_batched(path, seconds, batch):
    with ordo.Producer.open(path, domain="bench") as p:
        events, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or events < 5 * batch:
            with p.transaction() as tx:
                for i in range(batch):
                    tx.append(f"f{(events + i) % 1000}", "placed", {"n": events + i})
            events += batch
        return events, time.perf_counter() - start


def appends_one_per_transaction(path, seconds):
    with ordo.Producer.open(path, domain="bench") as p:
        events, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or events < 20:
            with p.transaction() as tx:
                tx.append(f"f{events % 1000}", "placed", {"n": events})
            events += 1
        return events, time.perf_counter() - start


def seed_style(path, seconds):
    """One commit per event with the standard library, as the seed did."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE flow (flow_id TEXT PRIMARY KEY, state TEXT NOT NULL, quantity INTEGER NOT NULL,"
                 " last_seq INTEGER NOT NULL)")
    conn.execute("CREATE TABLE outbox (event_id TEXT PRIMARY KEY, flow_id TEXT NOT NULL, seq INTEGER NOT NULL,"
                 " schema_version INTEGER NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL,"
                 " accepted INTEGER NOT NULL DEFAULT 0, UNIQUE (flow_id, seq))")
    events, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or events < 20:
        flow = f"f{events}"
        for step in STEPS:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT last_seq FROM flow WHERE flow_id = ?", (flow,)).fetchone()
            seq = (row[0] if row else 0) + 1
            conn.execute("INSERT INTO flow VALUES (?, ?, 5, ?) ON CONFLICT (flow_id) DO UPDATE SET"
                         " state = excluded.state, last_seq = excluded.last_seq", (flow, step, seq))
            conn.execute("INSERT INTO outbox (event_id, flow_id, seq, schema_version, type, payload)"
                         " VALUES (?, ?, ?, 1, ?, ?)", (f"{flow}-{seq}", flow, seq, step, json.dumps({"amount": 5})))
            conn.execute("COMMIT")
            events += 1
    elapsed = time.perf_counter() - start
    conn.close()
    return events, elapsed


def reservation_handler_in_python(tx, event):
    """The reference handler's work, written in Python (schema 1 only)."""
    row = tx.query("SELECT state, applied_seq FROM projection WHERE flow_id = ? AND producer = ?",
                   (event.flow_id, event.producer))
    if row and row[0][1] + 1 != event.seq:
        return ordo.Block("invalid_transition")
    tx.execute("INSERT INTO projection (flow_id, producer, state, quantity, applied_seq) VALUES (?, ?, ?, ?, ?)"
               " ON CONFLICT (flow_id, producer) DO UPDATE SET state = excluded.state,"
               " quantity = excluded.quantity, applied_seq = excluded.applied_seq",
               (event.flow_id, event.producer, event.type, event.payload["amount"], event.seq))
    tx.execute("INSERT INTO effect (flow_id, producer, seq, event_id) VALUES (?, ?, ?, ?)",
               (event.flow_id, event.producer, event.seq, event.event_id))


def applies(directory, flows, batch):
    """The same reservation events applied three ways (each from a producer
    store of its own, relayed first); events per second of each apply."""
    events = [(f"r{f}", step) for step in STEPS for f in range(flows)]
    results = {}
    for name in ("trivial_python", "reference_python", "reference_rust"):
        with ordo.Producer.open(os.path.join(directory, f"apply-{name}-p.db"), domain="reservation") as producer, \
                ordo.Consumer.open(os.path.join(directory, f"apply-{name}-c.db"), domain="reservation") as c:
            for first in range(0, len(events), batch):
                with producer.transaction() as tx:
                    for flow, step in events[first:first + batch]:
                        tx.append(flow, step, {"amount": 5})
            ordo.relay(producer, c)
            start = time.perf_counter()
            if name == "trivial_python":
                report = c.apply(lambda tx, event: None, batch=batch)
            elif name == "reference_python":
                report = c.apply(reservation_handler_in_python, batch=batch)
            else:
                report = reservation.apply(c)
            elapsed = time.perf_counter() - start
            applied = sum(f["applied"] for f in report.flows)
            assert applied == len(events), (name, applied, report.flows[:3])
            results[name] = (applied, elapsed)
    return results


def cli_bench(cli, flows, batch, directory):
    done = subprocess.run([cli, "bench", "--flows", str(flows), "--batch", str(batch), "--json", "--dir", directory],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"ordo bench exited {done.returncode}: {done.stderr.strip()[-500:]}")
    report = json.loads(done.stdout)
    run = report["runs"][0]
    return {
        "produce_batched": run["produce"]["events_per_s"],
        "apply_batched": run["apply"]["events_per_s"],
        "produce_one_per_transaction": report["unbatched"]["produce"]["events_per_s"],
        "apply_one_per_transaction": report["unbatched"]["apply"]["events_per_s"],
        "fsyncs_per_s": report["f_commits_per_s"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each timed Python run")
    parser.add_argument("--flows", type=int, default=2000, help="flows of the apply runs (three events each)")
    parser.add_argument("--batch", type=int, default=256, help="events per transaction of the batched runs")
    parser.add_argument("--cli", default=os.path.join(ROOT, "target", "release", "ordo"),
                        help="the ordo binary; '' skips the command line's runs")
    parser.add_argument("--cli-flows", type=int, default=300, help="ordo bench --flows (three events each)")
    parser.add_argument("--dir", default=None, help="where the temporary files go")
    args = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="ordo-pybench-", dir=args.dir)
    try:
        n, s = appends_batched(os.path.join(directory, "append-batched.db"), args.seconds, args.batch)
        py = {"append_batched": rate(n, s)}
        n, s = appends_one_per_transaction(os.path.join(directory, "append-one.db"), args.seconds)
        py["append_one_per_transaction"] = rate(n, s)
        n, s = seed_style(os.path.join(directory, "seed.db"), args.seconds)
        py["seed_style_one_commit_per_event"] = rate(n, s)
        for name, (n, s) in applies(directory, args.flows, args.batch).items():
            py[f"apply_{name}"] = rate(n, s)
        cli = None
        if args.cli and os.path.exists(args.cli):
            cli = cli_bench(args.cli, args.cli_flows, args.batch, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    boundary_us = (1 / py["apply_reference_python"] - 1 / py["apply_reference_rust"]) * 1e6
    rows = [
        ("appends, batched (tx.append)", py["append_batched"], cli and cli["produce_batched"]),
        ("appends, one per transaction", py["append_one_per_transaction"], cli and cli["produce_one_per_transaction"]),
        ("seed-style sqlite3, one commit per event", py["seed_style_one_commit_per_event"], None),
        ("apply, trivial Python handler", py["apply_trivial_python"], cli and cli["apply_batched"]),
        ("apply, reference handler in Python", py["apply_reference_python"], cli and cli["apply_batched"]),
        ("apply, reference handler in Rust (binding)", py["apply_reference_rust"], cli and cli["apply_batched"]),
    ]
    print(f"{'run':<44}{'Python ev/s':>14}{'CLI ev/s':>12}{'Python/CLI':>12}")
    for name, ours, theirs in rows:
        ratio = f"{ours / theirs:.2f}" if theirs else "-"
        print(f"{name:<44}{ours:>14.0f}{(f'{theirs:.0f}' if theirs else '-'):>12}{ratio:>12}")
    print(f"batched appends against the seed-style design: {py['append_batched'] / py['seed_style_one_commit_per_event']:.1f}x;"
          f" one per transaction: {py['append_one_per_transaction'] / py['seed_style_one_commit_per_event']:.2f}x")
    print(f"the Python boundary per applied event (reference handler, Python minus Rust): {boundary_us:.1f} us")
    if cli:
        print(f"disk: {cli['fsyncs_per_s']:.0f} fsync commits/s (ordo bench's F)")
    result = {
        "python": {k: round(v, 1) for k, v in py.items()},
        "cli": cli,
        "ratios_python_to_cli": cli and {
            "append_batched": round(py["append_batched"] / cli["produce_batched"], 3),
            "append_one_per_transaction": round(py["append_one_per_transaction"] / cli["produce_one_per_transaction"], 3),
            "apply_trivial_python": round(py["apply_trivial_python"] / cli["apply_batched"], 3),
            "apply_reference_python": round(py["apply_reference_python"] / cli["apply_batched"], 3),
        },
        "python_boundary_us_per_applied_event": round(boundary_us, 1),
        "settings": {"seconds": args.seconds, "flows": args.flows, "batch": args.batch, "cli_flows": args.cli_flows,
                     "python": sys.version.split()[0]},
    }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
