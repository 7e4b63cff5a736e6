"""Change rows of one table, ``public.t``, made in Python as a batch gives them to the state
sinks (no Spark, no server), and a seeded random workload of them with the table it leaves:
what test_spark_statefiles.py drives TableStateWriter with, and test_state_fuzz.py the
mirror table it damages."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

COLUMNS = [{"name": "id", "type": "integer", "key": True},
           {"name": "v", "type": "text", "key": False},
           {"name": "big", "type": "text", "key": False},
           {"name": "n", "type": "numeric(12,2)", "key": False}]
Row = tuple[str, str, str]  # v, big, n


def change(op: str, seq: int, commit_lsn: int, *, after: dict[str, Any] | None = None,
           before: dict[str, Any] | None = None, toast: tuple[str, ...] = ()) -> dict[str, Any]:
    """A change row as a batch gives it to the sinks (batch_rows), in the server's text."""
    import json

    def text(row: dict[str, Any] | None) -> list[tuple[str, str | None]] | None:
        return None if row is None else [(k, None if v is None else str(v))
                                         for k, v in row.items()]

    key = {"id": (before or after or {})["id"]}
    return {"schema": "public", "table": "t", "op": op, "seq": seq, "lsn": commit_lsn + seq,
            "commit_lsn": commit_lsn, "commit_time": None, "key": text(key),
            "before": text(before), "after": text(after),
            "before_json": None if before is None else json.dumps(before),
            "after_json": None if after is None else json.dumps(after),
            "unchanged_toast": list(toast), "columns": COLUMNS}


class Workload:
    """Random batches of changes of ``public.t`` and the table they leave (``rows``): new keys
    mostly ascending, updates that leave ``big`` unchanged (TOAST), key changes, deletes."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.rows: dict[int, Row] = {}
        self.next_id = 1
        self.lsn = 1000

    def batch(self, changes: int, *, recent: bool = False) -> list[dict[str, Any]]:
        r, out = self.random, []
        while len(out) < changes:
            seq = len(out)
            self.lsn += 100
            keys = sorted(self.rows)[-50:] if recent else list(self.rows)
            choice = r.random() if keys else 0.0
            if choice < 0.45:
                key = self.next_id if r.random() < 0.9 else r.randrange(1, self.next_id + 50)
                self.next_id = max(self.next_id, key) + 1
                if key in self.rows:
                    continue
                row = (f"v{key}", f"big-{key}-" + "x" * r.randrange(0, 40), f"{key}.25")
                out.append(change("INSERT", seq, self.lsn, after=self.values(key, row)))
                self.rows[key] = row
            elif choice < 0.8:
                key = r.choice(keys)
                new = self.next_id if r.random() < 0.2 else key
                self.next_id = max(self.next_id, new + 1)
                v, big, n = self.rows.pop(key)
                row = (f"{v}'", big, str(Decimal(n) + 1))
                after = {**self.values(new, row), "big": None}
                out.append(change("UPDATE", seq, self.lsn, after=after, toast=("big",),
                                  before={"id": key} if new != key else None))
                self.rows[new] = row
            else:
                key = r.choice(keys)
                del self.rows[key]
                out.append(change("DELETE", seq, self.lsn, before={"id": key}))
        return out

    @staticmethod
    def values(key: int, row: Row) -> dict[str, Any]:
        return {"id": key, "v": row[0], "big": row[1], "n": row[2]}
