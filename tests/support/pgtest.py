"""Helpers for tests against real servers: the server versions they run on and the settings
of their clusters, a database of a LocalCluster and its teardown."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from plugin_framework.cluster import LocalCluster, available_bindirs

BINDIRS = available_bindirs()

# Beyond the cluster's own defaults: commit timestamps, so tests can compare the commit times
# pgoutput sends with pg_xact_commit_timestamp(); and no autovacuum. An autovacuum ANALYZE is
# a transaction (it writes pg_statistic) that test_decoding and wal2json print as an empty one
# and pgoutput does not send: landing mid-workload at a moment of its own choosing, it made
# the parity diffs fail at random. Empty transactions are tested on purpose, with DDL.
TEST_SETTINGS = {"track_commit_timestamp": "on", "autovacuum": "off"}

_counter = itertools.count(1)


def unique_dbname(prefix: str = "t") -> str:
    return f"{prefix}_{next(_counter)}"


@dataclass
class TestDatabase:
    """A fresh database of a running cluster, with an autocommit connection kept open."""

    __test__: ClassVar[bool] = False  # not a test class, although pytest would think so

    cluster: LocalCluster
    dbname: str
    conninfo: str
    major_version: int
    _conn: psycopg.Connection[Any] | None = field(default=None, repr=False)
    _connections: list[psycopg.Connection[Any]] = field(default_factory=list, repr=False)

    def execute(self, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit; the rows it returned, or [] if it returns none."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, autocommit=True)
        cur = self._conn.execute(query, params)
        return cur.fetchall() if cur.description is not None else []

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A new connection to this database (closed at teardown if still open)."""
        conn = psycopg.connect(self.conninfo, **kwargs)
        self._connections.append(conn)
        return conn

    def close(self) -> None:
        for conn in [self._conn, *self._connections]:
            if conn is not None and not conn.closed:
                conn.close()
        self._conn = None
        self._connections.clear()


def create_database(cluster: LocalCluster, dbname: str | None = None) -> TestDatabase:
    dbname = dbname or unique_dbname()
    with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
        # FILE_COPY: the default (WAL_LOG) writes the template's every block to the WAL, which
        # every slot of the cluster then reads through; copying the files takes half the
        # time (and the checkpoint it needs is cheap with fsync off).
        conn.execute(sql.SQL("CREATE DATABASE {} STRATEGY FILE_COPY")
                     .format(sql.Identifier(dbname)))
    return TestDatabase(cluster, dbname, cluster.conninfo(dbname), cluster.major_version)


def drop_database(db: TestDatabase) -> None:
    """Close the database's connections, drop its slots, roll back its prepared transactions,
    then drop it, terminating whatever is still connected."""
    db.close()
    cluster, dbname = db.cluster, db.dbname
    with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
        _drop_slots(admin, dbname)
        prepared = admin.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (dbname,)
        ).fetchall()
        if prepared:
            # ROLLBACK PREPARED works only from the database that prepared the transaction.
            with psycopg.connect(db.conninfo, autocommit=True) as conn:
                for (gid,) in prepared:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(dbname)))
        # Replication origins are cluster-wide; tests name theirs after their database.
        admin.execute(
            "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin "
            "WHERE roname LIKE %s", (dbname.replace("_", r"\_") + r"\_%",))


def _drop_slots(admin: psycopg.Connection[Any], dbname: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        slots = admin.execute(
            "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
            (dbname,),
        ).fetchall()
        if not slots:
            return
        for name, pid in slots:
            try:
                if pid is not None:
                    admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
                admin.execute("SELECT pg_drop_replication_slot(%s)", (name,))
            except psycopg.errors.ObjectInUse:
                # Released by a terminated walsender a moment later, or taken again.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            except psycopg.errors.UndefinedObject:
                pass  # a temporary slot that went away with its session
