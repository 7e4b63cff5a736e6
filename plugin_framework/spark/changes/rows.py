"""A batch's change rows by table, as the mirrors read them: ``batch_rows(batch_df)`` gives
each table's rows (``TableRows``) in ``(commit_lsn, seq)`` order, from the Arrow table the
batch's DataFrame was made of in this process (``remember_rows``, ``local_rows``) where it
was, else with one collect."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["NET_COLUMNS", "TableRows", "batch_rows", "local_rows", "remember_rows"]

# The columns of a batch's change rows that the mirrors read (what net_changes needs)
NET_COLUMNS = ("schema", "table", "op", "lsn", "commit_lsn", "commit_time", "seq", "key",
               "before", "after", "before_json", "after_json", "unchanged_toast", "columns")


class TableRows(Sequence[dict[str, Any]]):
    """One table's change rows of a batch, in ``(commit_lsn, seq)`` order: an Arrow table of
    NET_COLUMNS (``arrow``), and its rows as dicts when they are read (then ``pristine`` is
    false: a reader may have changed them, descriptions.describe_rows renames columns)."""

    def __init__(self, arrow: pa.Table, columns: list[Any]) -> None:
        """``columns``: each row's ``columns``, converted (the batch repeats them)."""
        self.arrow = arrow
        self.columns = columns
        self._rows: list[dict[str, Any]] | None = None

    @property
    def pristine(self) -> bool:
        return self._rows is None

    def _dicts(self) -> list[dict[str, Any]]:
        if self._rows is None:
            names = [n for n in NET_COLUMNS if n != "columns"]
            values = [self.arrow.column(n).to_pylist() for n in names]
            keys = [*names, "columns"]
            self._rows = [dict(zip(keys, row, strict=True))
                          for row in zip(*values, self.columns, strict=True)]
        return self._rows

    def __len__(self) -> int:
        return int(self.arrow.num_rows)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self._dicts()[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._dicts())


# The Arrow table each DataFrame of a batch was made of, in the driver: what sinks that
# collect the batch read instead of sending it back from the JVM (batch_rows).
_LOCAL_ROWS: weakref.WeakKeyDictionary[Any, pa.Table] = weakref.WeakKeyDictionary()


def remember_rows(df: Any, table: pa.Table) -> None:
    """``df`` was created from ``table`` (of the change schema), in this process."""
    _LOCAL_ROWS[df] = table


def local_rows(df: Any) -> pa.Table | None:
    """The Arrow table ``df`` was created from, if it was here (else None)."""
    try:
        return _LOCAL_ROWS.get(df)
    except TypeError:  # a DataFrame that cannot be weakly referenced (Spark Connect)
        return None


def batch_rows(df: Any) -> dict[tuple[str, str], TableRows]:
    """A batch's change rows by table, each table's in ``(commit_lsn, seq)`` order (one
    collect; rows made dicts only where a sink reads them so)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = local_rows(df)
    if table is None:
        table = df.select(*NET_COLUMNS).toArrow()
    table = table.select(list(NET_COLUMNS))
    if table.num_rows == 0:
        return {}
    columns = descriptions(table.column("columns"))
    names = pc.dictionary_encode(pc.binary_join_element_wise(
        table.column("schema"), table.column("table"), "\x00").combine_chunks())
    out = {}
    for i, name in enumerate(names.dictionary.to_pylist()):
        schema, _, relation = name.partition("\x00")
        where = pc.indices_nonzero(pc.equal(names.indices, pa.scalar(i, names.indices.type)))
        rows = table.take(where)
        order = pc.sort_indices(rows, [("commit_lsn", "ascending"), ("seq", "ascending")])
        out[schema, relation] = TableRows(
            rows.take(order), [columns[j] for j in where.take(order).to_pylist()])
    return out


def descriptions(columns: pa.ChunkedArray) -> list[Any]:
    """The change rows' ``columns`` (to_pylist's form), converted once per distinct value:
    a batch repeats each table's description on every row of it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = columns.combine_chunks() if isinstance(columns, pa.ChunkedArray) else columns
    if len(columns) == 0:
        return []
    fields = pc.list_flatten(columns)
    parts = [pc.cast(fields.field(i), pa.string()) for i in range(fields.type.num_fields)]
    each = pc.binary_join_element_wise(*[pc.fill_null(p, "\x02") for p in parts], "\x00")
    offsets = pc.subtract(columns.offsets, columns.offsets[0])
    per_row = pc.binary_join(pa.ListArray.from_arrays(offsets, each, mask=columns.is_null()),
                             "\x01")
    indices = pc.dictionary_encode(pc.fill_null(per_row, "\x03")).indices.to_pylist()
    firsts: dict[int, int] = {}
    for row, index in enumerate(indices):
        firsts.setdefault(index, row)
    converted = dict(zip(firsts, columns.take(list(firsts.values())).to_pylist(), strict=True))
    return [converted[i] for i in indices]
