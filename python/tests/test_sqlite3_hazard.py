"""Why ordo's SQLite files are not opened with the ``sqlite3`` module in the
same process (docs/python.md, "Do not open ordo's SQLite files with the
sqlite3 module").

ordo carries its own copy of SQLite. Two copies in one process do not know
of each other's POSIX locks, and closing a file descriptor releases every
lock the process holds on that file: after ``sqlite3.connect(path).close()``
ordo's open write transaction no longer holds the file against another
process. Here a second process then takes the file, leaves WAL, and
writes while ordo's transaction is open; without the ``sqlite3`` call it is
refused.
"""

import sqlite3
import subprocess
import sys

import pytest

import ordo

# A second process: leave WAL (this needs the file to itself) and write.
SECOND_WRITER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0.5, isolation_level=None)
try:
    mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
    conn.execute("INSERT INTO t VALUES ('second process')")
    print("wrote", mode)
except sqlite3.OperationalError as e:
    print("refused:", e)
"""

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX advisory locks")


def second_writer(path):
    done = subprocess.run([sys.executable, "-c", SECOND_WRITER, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def rows_in_file(path):
    conn = sqlite3.connect(path)  # ordo's store is closed by now: no hazard
    try:
        return sorted(who for (who,) in conn.execute("SELECT who FROM t"))
    finally:
        conn.close()


@pytest.mark.parametrize("touch_with_sqlite3", [False, True], ids=["ordo_alone", "after_sqlite3_close"])
def test_sqlite3_close_in_the_same_process_drops_ordos_lock(tmp_path, touch_with_sqlite3):
    path = tmp_path / "app.db"
    store = ordo.Producer.open(path, domain="app", migrations=["CREATE TABLE t (who TEXT)"])
    tx = store.transaction()  # BEGIN IMMEDIATE: the write lock, held open
    tx.execute("INSERT INTO t VALUES ('ordo')")
    if touch_with_sqlite3:
        sqlite3.connect(path).close()  # the hazard: another SQLite copy closes its descriptor
    second = second_writer(path)
    tx.commit()
    seen = sorted(who for (who,) in store.query("SELECT who FROM t"))
    store.close()
    if not touch_with_sqlite3:
        # ordo holds the file: the second process waits, then gives up.
        assert second == "refused: database is locked"
        assert seen == ["ordo"]
        assert rows_in_file(path) == ["ordo"]
        return
    # The lock is gone: the second process took the file out of WAL and
    # wrote while ordo's write transaction was open, and one of the two
    # committed writes is lost.
    assert second == "wrote delete"
    assert seen != ["ordo", "second process"]
    assert rows_in_file(path) != ["ordo", "second process"]
