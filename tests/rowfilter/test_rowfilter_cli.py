"""Row filters through `pgdecode stream` and `pgdecode replay`, end to end: the server's
filtered publication, pgdecode's client-side filter over an unfiltered one, and the same filter
over a capture of the unfiltered one give the same output; bad filters get the same refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.streamkit import run_stream


def pgdecode(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "plugin_framework.cli", *args],
                          capture_output=True, text=True, timeout=300)


def stream_text(db: Any, slot: str, publication: str, out: Path, end: str,
                *extra: str) -> subprocess.CompletedProcess[str]:
    """``pgdecode stream`` with the text emitter, without xids (they differ between slots)."""
    return run_stream(db.conninfo, slot, out, "--publication", publication, "-E", end, "-q",
                      "--emitter", "text", "-o", "include-xids=0", *extra,
                      env=dict(os.environ), timeout=300)


def capture(db: Any, slot: str, publication: str, out: Path, end: str) -> None:
    done = pgdecode("capture", "-d", db.conninfo, "-S", slot, "--publication", publication,
                    "-E", end, "-q", "-f", str(out))
    assert done.returncode == 0, done.stderr


def replay(capture: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return pgdecode("replay", str(capture), "--emitter", "text", "-o", "include-xids=0",
                    "-f", str(out), *extra)


def filtered_workload(db: Any, *slots: str) -> str:
    """Table t, publications ``everything`` and ``filtered`` (a row filter and a column list),
    the slots, then the changes (made after the slots, so each slot has them all); the
    end LSN."""
    db.execute("CREATE TABLE t (id int, region text, n int, PRIMARY KEY (id, region))")
    db.execute("CREATE PUBLICATION everything FOR TABLE t")
    db.execute("CREATE PUBLICATION filtered FOR TABLE t (id, region) "
               "WHERE (region = 'NSW' AND id > 2)")
    db.execute("CREATE PUBLICATION rows_only FOR TABLE t WHERE (region = 'NSW' AND id > 2)")
    for slot in slots:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    with db.connect(autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute("INSERT INTO t SELECT g, CASE WHEN g % 2 = 0 THEN 'NSW' ELSE 'VIC' END, g "
                     "FROM generate_series(1, 10) g")
        conn.execute("UPDATE t SET region = 'VIC' WHERE id = 4")  # leaves the filter: DELETE
        conn.execute("UPDATE t SET region = 'NSW' WHERE id = 5")  # enters it: INSERT
        conn.execute("UPDATE t SET n = 0 WHERE id = 6")  # stays in: UPDATE
        conn.execute("DELETE FROM t WHERE id IN (1, 8)")
        conn.execute("TRUNCATE t")
        return str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])  # type: ignore[index]


def server_and_client(db: Any, tmp_path: Path, publication: str, *client_filter: str
                      ) -> list[str]:
    """The filtered workload through ``publication`` (the server filters) and through
    ``everything`` with ``client_filter`` (pgdecode filters): asserts the outputs are the
    same, and returns the change lines (without their ``table public.t: ``)."""
    server_slot, client_slot = f"{db.dbname}_server", f"{db.dbname}_client"
    end = filtered_workload(db, server_slot, client_slot)
    server, client = tmp_path / "server.out", tmp_path / "client.out"
    done = stream_text(db, server_slot, publication, server, end)
    assert done.returncode == 0, done.stderr
    done = stream_text(db, client_slot, "everything", client, end, *client_filter)
    assert done.returncode == 0, done.stderr
    lines = client.read_text().splitlines()
    assert lines == server.read_text().splitlines()
    return [line.removeprefix("table public.t: ") for line in lines
            if line.startswith("table ")]


def test_cli_filters_match_the_servers(db: Any, tmp_path: Path) -> None:
    changes = server_and_client(db, tmp_path, "filtered",
                                "--filters-from-publication", "filtered")
    # The UPDATE transformations: id 4 left the filter (a DELETE), 5 entered it (an INSERT),
    # 6 stayed (an UPDATE); 1 was never in it; and the n column is not in the column list.
    assert any(c.startswith("DELETE: id[integer]:4 ") for c in changes), changes
    assert "INSERT: id[integer]:5 region[text]:'NSW'" in changes
    assert any(c.startswith("UPDATE: ") and "id[integer]:6 " in c for c in changes)
    assert not any("id[integer]:1 " in c for c in changes)
    assert not any("n[integer]" in c for c in changes)


def test_a_row_filter_alone_matches_the_server_through_the_fast_path(db: Any,
                                                                     tmp_path: Path) -> None:
    """Without a column list, the changes the filter passes unaltered are printed by the
    emitter's C formatter from the raw message (docs/framework.md, "fast_change"); those it
    turns into an INSERT or a DELETE by the callback. Both as the server publishes them."""
    changes = server_and_client(db, tmp_path, "rows_only",
                                "--row-filter", "public.t:(region = 'NSW' AND id > 2)")
    assert "INSERT: id[integer]:6 region[text]:'NSW' n[integer]:6" in changes
    assert any(c.startswith("DELETE: id[integer]:4 ") for c in changes), changes
    assert "INSERT: id[integer]:5 region[text]:'NSW' n[integer]:5" in changes


def test_bad_filter_fails_before_streaming(db: Any, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    db.execute("CREATE PUBLICATION p FOR TABLE t")
    slot = f"{db.dbname}_s"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    before = db.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                        "WHERE slot_name = %s", (slot,))
    db.execute("INSERT INTO t VALUES (1, 1)")
    done = stream_text(db, slot, "p", tmp_path / "out", "1/0", "--row-filter",
                       "public.t:(random() > 0.5)")
    assert done.returncode == 1
    assert "invalid publication WHERE expression" in done.stderr
    assert "Traceback" not in done.stderr
    after = db.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                       "WHERE slot_name = %s", (slot,))
    assert after == before  # nothing acknowledged


# --- replay: the same options, the same code, the same output -----------------------------------


def test_replay_filters_as_stream(db: Any, tmp_path: Path) -> None:
    """A capture of the unfiltered publication, replayed with filters, gives what the server's
    filtered publication gives, and what `stream` gives with the same options."""
    server, client, captured = (f"{db.dbname}_{s}" for s in ("server", "client", "capture"))
    end = filtered_workload(db, server, client, captured)
    streamed = {"server": tmp_path / "server.out", "client": tmp_path / "client.out"}
    done = stream_text(db, server, "filtered", streamed["server"], end)
    assert done.returncode == 0, done.stderr
    options = ("--row-filter", "public.t:(region = 'NSW' AND id > 2)",
               "--column-list", "public.t:id,region")
    done = stream_text(db, client, "everything", streamed["client"], end, *options)
    assert done.returncode == 0, done.stderr
    expected = streamed["server"].read_text().splitlines()
    assert streamed["client"].read_text().splitlines() == expected
    assert any(line.startswith("table public.t: DELETE: id[integer]:4 ") for line in expected)
    assert not any("n[integer]" in line for line in expected)
    pgd = tmp_path / "everything.pgd"
    capture(db, captured, "everything", pgd, end)
    unfiltered = tmp_path / "unfiltered.out"
    done = replay(pgd, unfiltered)
    assert done.returncode == 0, done.stderr
    assert unfiltered.read_text().splitlines() != expected  # the filters do something
    for name, extra in [("options", options),
                        ("publication", ("--filters-from-publication", "filtered"))]:
        out = tmp_path / f"replayed-{name}.out"
        done = replay(pgd, out, "-d", db.conninfo, *extra)
        assert done.returncode == 0, done.stderr
        assert out.read_text().splitlines() == expected, name


def test_replay_column_list_without_a_connection(db: Any, tmp_path: Path) -> None:
    """Column lists need no catalog: replay without -d projects as `stream` does with one."""
    client, captured = f"{db.dbname}_client", f"{db.dbname}_capture"
    end = filtered_workload(db, client, captured)
    streamed = tmp_path / "streamed.out"
    done = stream_text(db, client, "everything", streamed, end,
                       "--column-list", "public.t:region,id")
    assert done.returncode == 0, done.stderr
    pgd = tmp_path / "everything.pgd"
    capture(db, captured, "everything", pgd, end)
    replayed = tmp_path / "replayed.out"
    done = replay(pgd, replayed, "--column-list", "public.t:region,id")
    assert done.returncode == 0, done.stderr
    lines = streamed.read_text().splitlines()
    assert replayed.read_text().splitlines() == lines
    assert any(line.startswith("table public.t: UPDATE: ") for line in lines)
    assert not any("n[integer]" in line for line in lines)


def test_replay_refuses_bad_filters_as_stream(db: Any, tmp_path: Path) -> None:
    """The same refusals, word for word, before the output is touched; and what needs the
    catalog without -d is refused saying to pass it."""
    slot = f"{db.dbname}_s"
    end = filtered_workload(db, slot)
    pgd = tmp_path / "everything.pgd"
    capture(db, slot, "everything", pgd, end)
    out = tmp_path / "out"
    out.write_text("earlier output\n")
    bad = [("--row-filter", "public.t:(random() > 0.5)"),
           ("--row-filter", "public.t:(n > 0)"),  # n is not in the replica identity
           ("--column-list", "public.t:id,nope"),
           ("--row-filter", "n > 0"),
           ("--filters-from-publication", "nope")]
    for extra in bad:
        streamed = stream_text(db, slot, "everything", tmp_path / "streamed", end, *extra)
        replayed = replay(pgd, out, "-d", db.conninfo, *extra)
        assert streamed.returncode == 1 and "Traceback" not in streamed.stderr, streamed.stderr
        assert (replayed.returncode, replayed.stderr) == (1, streamed.stderr), extra
        assert out.read_text() == "earlier output\n"
        assert not (tmp_path / "out.progress").exists()
        if extra == bad[0]:
            assert "invalid publication WHERE expression" in streamed.stderr
    for extra in [("--row-filter", "public.t:(n > 0)"),
                  ("--filters-from-publication", "filtered")]:
        replayed = replay(pgd, out, *extra)
        assert replayed.returncode == 2, replayed.stderr
        assert "pass -d CONNINFO" in replayed.stderr
        assert out.read_text() == "earlier output\n"
    # Without -d a column list is checked against the capture's own table descriptions,
    # still before anything is written.
    for extra, says in [(("--column-list", "public.t:id,nope"), 'column "nope"'),
                        (("--column-list", "public.t:region"), 'replica identity column "id"')]:
        replayed = replay(pgd, out, *extra)
        assert replayed.returncode == 1 and says in replayed.stderr, replayed.stderr
        assert "Traceback" not in replayed.stderr
        assert out.read_text() == "earlier output\n"
        assert not (tmp_path / "out.progress").exists()
