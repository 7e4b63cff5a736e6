"""The columnar builder that turns decoded changes into Arrow tables of the change schema
(schema.py).

Building is columnar: each change appends to flat Python lists (the raw text bytes of its
columns go in unconverted) and ``to_arrow`` makes the Arrow arrays in one pass each; per
transaction and per relation fields are stored once and expanded with ``take``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Final

import orjson

from plugin_framework import LSN
from plugin_framework.protocol import KIND_BINARY, KIND_NULL, KIND_TEXT
from plugin_framework.spark.changes.plans import EMPTY, ArrowRowPlan, PlanCache, row_of, text_of
from plugin_framework.spark.changes.schema import arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ChangeBuilder"]

_dumps: Final = orjson.dumps
_call: Final = operator.call


class _TxnInfo:
    __slots__ = ("commit_lsn", "commit_time", "end_lsn", "gid", "insert_op", "origin", "rows",
                 "xid")

    def __init__(self, xid: int | None, snapshot: bool = False) -> None:
        self.xid = xid
        # a snapshot's rows are inserts marked as snapshot reads (docs/snapshot.md)
        self.insert_op = "SNAPSHOT" if snapshot else "INSERT"
        self.commit_lsn: int | None = None
        self.end_lsn: int | None = None
        self.commit_time: datetime | None = None
        self.origin: str | None = None
        self.gid: str | None = None
        self.rows = 0


_Mark = tuple[int, int, int, int, int, int]


class ChangeBuilder:
    """Accumulates change rows column by column; ``to_arrow`` makes the table.

    Rows belong to transactions opened with ``open_txn`` and finished with ``close_txn``
    (which supplies what is only known at commit). ``mark``/``rollback`` drop the rows of a
    transaction that must not be delivered after all.
    """

    def __init__(self, plans: PlanCache) -> None:
        self.plans = plans
        self.nbytes = 0
        self._clear()

    def _clear(self) -> None:
        self.lsn: list[int] = []
        self.seq: list[int] = []
        self.op: list[str] = []
        self.rel: list[int] = []
        self.txn: list[int] = []
        self.key_len: list[int | None] = []
        self.key_k: list[str] = []
        self.key_v: list[bytes | None] = []
        self.before_len: list[int | None] = []
        self.before_k: list[str] = []
        self.before_v: list[bytes | None] = []
        self.after_len: list[int | None] = []
        self.after_k: list[str] = []
        self.after_v: list[bytes | None] = []
        self.before_json: list[bytes | None] = []
        self.after_json: list[bytes | None] = []
        self.toast: list[list[str]] = []
        self.txns: list[_TxnInfo] = []
        self.relations: list[ArrowRowPlan] = []
        self._rel_index: dict[int, int] = {}
        self._last_relation: Any = None
        self._last_plan: tuple[ArrowRowPlan, int] | None = None
        self.nbytes = 0
        # what the C appender appends to (_changerows.c's L_* order)
        self._lists = (self.lsn, self.seq, self.op, self.rel, self.txn, self.key_len,
                       self.key_k, self.key_v, self.before_len, self.before_k, self.before_v,
                       self.after_len, self.after_k, self.after_v, self.before_json,
                       self.after_json, self.toast)

    def clear(self) -> None:
        self._clear()

    def __len__(self) -> int:
        return len(self.lsn)

    @property
    def rows(self) -> int:
        return len(self.lsn)

    # -- transactions

    def open_txn(self, xid: int | None, *, snapshot: bool = False) -> int:
        """A transaction, or (``snapshot``, no xid) a chunk of a snapshot's rows."""
        self.txns.append(_TxnInfo(xid, snapshot))
        return len(self.txns) - 1

    def open_for(self, txn: Any) -> tuple[int, _Mark]:
        """``txn``'s rows from now on: its index, and the mark to roll back to if it is cut
        short (a lost connection: the server sends it again). A snapshot chunk has no xid."""
        mark = self.mark()
        snapshot = bool(getattr(txn, "is_snapshot", False))
        return self.open_txn(None if snapshot else txn.xid, snapshot=snapshot), mark

    def close_txn(self, index: int, txn: Any, commit_lsn: int) -> None:
        info = self.txns[index]
        info.commit_lsn = int(commit_lsn)
        info.end_lsn = None if txn.end_lsn is None else int(txn.end_lsn)
        info.commit_time = txn.commit_time
        info.origin = txn.origin
        info.gid = txn.gid

    def txn_rows(self, index: int) -> int:
        return self.txns[index].rows

    def mark(self) -> _Mark:
        return (len(self.lsn), len(self.key_k), len(self.before_k), len(self.after_k),
                len(self.txns), self.nbytes)

    def rollback(self, mark: _Mark) -> None:
        """Drop every row and transaction added since ``mark``."""
        n, nk, nb, na, nt, nbytes = mark
        for lst in (self.lsn, self.seq, self.op, self.rel, self.txn, self.key_len,
                    self.before_len, self.after_len, self.before_json, self.after_json,
                    self.toast):
            del lst[n:]
        del self.key_k[nk:], self.key_v[nk:], self.before_k[nb:], self.before_v[nb:]
        del self.after_k[na:], self.after_v[na:], self.txns[nt:]
        self.nbytes = nbytes

    # -- rows

    def _rel(self, plan: ArrowRowPlan) -> int:
        index = self._rel_index.get(id(plan))
        if index is None:
            index = self._rel_index[id(plan)] = len(self.relations)
            self.relations.append(plan)
        return index

    def _plan(self, relation: Any) -> tuple[ArrowRowPlan, int]:
        if relation is self._last_relation:
            return self._last_plan  # type: ignore[return-value]
        plan = self.plans.plan(relation)
        found = (plan, self._rel(plan))
        self._last_relation, self._last_plan = relation, found
        return found

    def _key(self, plan: ArrowRowPlan, data: Any) -> None:
        kinds, values = data.kinds, data.values
        n = 0
        for i in plan.key_idx:
            k = kinds[i]
            if k == KIND_TEXT or k == KIND_NULL:
                self.key_k.append(plan.names[i])
                self.key_v.append(values[i])
                n += 1
            elif k == KIND_BINARY:
                raw = values[i]
                assert raw is not None
                self.key_k.append(plan.names[i])
                self.key_v.append(text_of(plan.bconv[i](raw)))
                n += 1
        self.key_len.append(n)

    def add_change(self, txn_index: int, change: Any) -> None:
        plan, rel_index = self._plan(change.relation)
        new, old = change.new, change.old
        nbytes = 64
        if new is not None:
            data = new.data
            values = data.values
            if data.kinds == plan.all_text:  # the usual row: every column text, none NULL
                names = plan.names
                self.after_len.append(plan.width)
                self.after_k += names
                self.after_v += values
                js = _dumps(dict(zip(names, map(_call, plan.tconv, values), strict=False)))
                self.toast.append(EMPTY)
                key0 = plan.key0
                if key0 >= 0:
                    self.key_len.append(1)
                    self.key_k.append(plan.key_names[0])
                    self.key_v.append(values[key0])
                elif plan.key_idx:
                    self._key(plan, data)
                else:
                    self.key_len.append(None)
            else:
                keys, texts, typed, toast = row_of(plan, data.kinds, values)
                js = _dumps(typed)
                self.after_len.append(len(keys))
                self.after_k += keys
                self.after_v += texts
                self.toast.append(toast or EMPTY)
                if plan.key_idx:
                    self._key(plan, data)
                else:
                    self.key_len.append(None)
            self.after_json.append(js)
            nbytes += 2 * len(js)
        else:
            self.after_len.append(None)
            self.after_json.append(None)
            self.toast.append(EMPTY)
        if old is not None:
            data = old.data
            keys, texts, typed, _ = row_of(plan, data.kinds, data.values,
                                         plan.key_idx if change.old_is_key else None)
            js = _dumps(typed)
            self.before_len.append(len(keys))
            self.before_k += keys
            self.before_v += texts
            self.before_json.append(js)
            nbytes += 2 * len(js)
            if new is None:
                if plan.key_idx:
                    self._key(plan, data)
                else:
                    self.key_len.append(None)
        else:
            self.before_len.append(None)
            self.before_json.append(None)
        self.lsn.append(change.lsn)
        info = self.txns[txn_index]
        self.seq.append(info.rows)
        info.rows += 1
        action = change.action
        self.op.append(info.insert_op if action == "INSERT" else action)
        self.rel.append(rel_index)
        self.txn.append(txn_index)
        self.nbytes += nbytes

    def raw_writer(self, txn_index: int, relation: Any
                   ) -> Callable[[bytes, int, Any], bool | None] | None:
        """A ``fast_change`` formatter (docs/framework.md) of ``relation``'s changes in the
        transaction ``txn_index``: it appends a raw row-change message as ``add_change``
        appends the decoded change, and returns True, or None for ``add_change`` to take
        it. None where the C appender is not built."""
        plan, rel_index = self._plan(relation)
        if plan.fast is None:
            return None
        append = plan.fast.append
        info = self.txns[txn_index]

        def write(data: bytes, lsn: int, txn: Any) -> bool | None:
            n = append(data, lsn, info.rows, rel_index, txn_index, info.insert_op, self._lists)
            if n is None:
                return None
            info.rows += 1
            self.nbytes += n
            return True
        return write

    def add_truncate(self, txn_index: int, relations: Iterable[Any], lsn: int) -> None:
        info = self.txns[txn_index]
        for relation in relations:
            plan = self.plans.plan(relation)
            self.lsn.append(lsn)
            self.seq.append(info.rows)
            info.rows += 1
            self.op.append("TRUNCATE")
            self.rel.append(self._rel(plan))
            self.txn.append(txn_index)
            self.key_len.append(None)
            self.before_len.append(None)
            self.after_len.append(None)
            self.before_json.append(None)
            self.after_json.append(None)
            self.toast.append(EMPTY)
            self.nbytes += 64

    def extend(self, other: ChangeBuilder) -> None:
        """Append another builder's rows and transactions (a prepared transaction's, at
        COMMIT PREPARED)."""
        txn_base = len(self.txns)
        rel_map = [self._rel(plan) for plan in other.relations]
        self.lsn += other.lsn
        self.seq += other.seq
        self.op += other.op
        self.rel += [rel_map[r] for r in other.rel]
        self.txn += [t + txn_base for t in other.txn]
        for name in ("key_len", "key_k", "key_v", "before_len", "before_k", "before_v",
                     "after_len", "after_k", "after_v", "before_json", "after_json", "toast",
                     "txns"):
            getattr(self, name).extend(getattr(other, name))
        self.nbytes += other.nbytes

    # -- Arrow

    @property
    def first_commit_lsn(self) -> int | None:
        return self.txns[0].commit_lsn if self.txns else None

    def to_arrow(self) -> pa.Table:
        """The rows as an Arrow table of ``arrow_schema()``."""
        import pyarrow as pa

        target = arrow_schema()
        txn_idx = pa.array(self.txn, pa.int32())
        rel_idx = pa.array(self.rel, pa.int32())
        txns, rels = self.txns, self.relations
        by_txn = {
            "commit_lsn": pa.array([t.commit_lsn for t in txns], pa.int64()),
            "xid": pa.array([t.xid for t in txns], pa.int64()),
            "commit_time": pa.array([t.commit_time for t in txns], pa.timestamp("us", "UTC")),
            "origin": pa.array([t.origin for t in txns], pa.string()),
            "gid": pa.array([t.gid for t in txns], pa.string()),
        }
        by_rel = {
            "schema": pa.array([p.schema for p in rels], pa.string()),
            "table": pa.array([p.table for p in rels], pa.string()),
            "columns": pa.array([p.descriptor for p in rels],
                                target.field("columns").type),
        }
        arrays: dict[str, Any] = {
            "lsn": pa.array(self.lsn, pa.int64()),
            "seq": pa.array(self.seq, pa.int32()),
            "op": pa.array(self.op, pa.string()),
            "key": _map(self.key_len, self.key_k, self.key_v),
            "before": _map(self.before_len, self.before_k, self.before_v),
            "after": _map(self.after_len, self.after_k, self.after_v),
            "before_json": _strings(self.before_json),
            "after_json": _strings(self.after_json),
            "unchanged_toast": pa.array(self.toast, pa.list_(pa.string())),
        }
        for name, arr in by_txn.items():
            arrays[name] = arr.take(txn_idx)
        for name, arr in by_rel.items():
            arrays[name] = arr.take(rel_idx)
        columns = []
        for field in target:
            arr = arrays[field.name]
            if arr.type != field.type:
                arr = arr.cast(field.type)
            columns.append(arr)
        return pa.Table.from_arrays(columns, schema=target)


def _strings(values: list[bytes | None]) -> pa.Array:
    import pyarrow as pa

    arr = pa.array(values, pa.binary())
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8 (a SQL_ASCII database): replace what is not
        return pa.array([None if v is None else v.decode(errors="replace") for v in values],
                        pa.string())


def _map(lengths: list[int | None], keys: list[str], values: list[bytes | None]) -> pa.Array:
    import pyarrow as pa

    offsets = [0, *accumulate(n or 0 for n in lengths)]
    mask = pa.array([n is None for n in lengths], pa.bool_())
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   _strings(values), mask=mask)


def lsn_or_none(value: Any) -> LSN | None:
    return None if value is None else LSN(value)
