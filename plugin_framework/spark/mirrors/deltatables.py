"""Delta tables through the ``deltalake`` package (delta-rs) as the Delta mirrors use them:
reading a table (``read_delta``, ``delta_dataset``, ``delta_arrow``: also one whose
statistics deltalake's Python cannot parse), the rows under given keys (``target_rows``),
what pgdecode recorded in a table's commits (the description, the query of a batch), and
the names and time zones of delta-rs's MERGE."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from plugin_framework.spark.columns.descriptions import Description, TableInfo
from plugin_framework.spark.mirrors.keys import key_names
from plugin_framework.spark.mirrors.template import state_path

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "APP",
    "APP_ID",
    "DESCRIPTION",
    "QUERY",
    "delta_arrow",
    "delta_dataset",
    "keys_match",
    "query_of_app",
    "quote",
    "read_delta",
    "stored_description",
    "target_rows",
    "utc_table",
]

APP_ID = "pgdecode"
DESCRIPTION = "pgdecode.description"
QUERY = "pgdecode.query"  # the streaming query a commit's batch is of (queries.query_of)
APP = "pgdecode.app"  # the app_id whose transaction version the commit set
# the table equals the source's as of this WAL position (bytes; absent: not known to)
CONSISTENT = "pgdecode.consistent_lsn"


def read_delta(path: str, table: str, storage_options: dict[str, str] | None = None) -> Any:
    """The state of ``schema.table`` that ``DeltaTableWriter(path)`` keeps, as a
    ``deltalake.DeltaTable``."""
    from deltalake import DeltaTable

    return DeltaTable(state_path(path, table), storage_options=storage_options)


def delta_dataset(table: Any) -> Any:
    """The rows of ``deltalake.DeltaTable`` ``table`` as a ``pyarrow.dataset.Dataset``:
    ``table.to_pyarrow_dataset()``, which skips files by their statistics. deltalake's
    Python cannot parse a statistic of a date or timestamp before year 1 (it fails on
    ``'-0001-01-01'``), which a mirror may hold; such a table is read whole, by deltalake's
    own query engine (``QueryBuilder``), into memory."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import QueryBuilder

    try:
        return table.to_pyarrow_dataset()
    except ValueError as e:
        try:
            rows = QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()
            return ds.dataset(pa.table(rows).cast(pa.schema(table.schema().to_arrow())))
        except Exception:
            raise e from None


def delta_arrow(table: Any) -> pa.Table:
    """Every row of ``deltalake.DeltaTable`` ``table``, as ``table.to_pyarrow_table()``
    gives them where it can (``delta_dataset``)."""
    return delta_dataset(table).to_table()


def keys_match(info: TableInfo) -> str:
    """The MERGE condition of target ``t`` and source ``s`` rows on the table's key."""
    return " AND ".join(f"(t.{quote(k)} IS NOT DISTINCT FROM s.{quote(k)})"
                        for k in key_names(info))


def quote(name: str) -> str:
    """A column name as an SQL identifier of delta-rs's expressions (DataFusion)."""
    return '"' + name.replace('"', '""') + '"'


def stored_description(table: Any) -> Description | None:
    """The description the table's newest pgdecode commit recorded (other writers' commits,
    such as OPTIMIZE, record none)."""
    commit = _pgdecode_commit(table)
    if commit is None:
        return None
    return tuple((str(n), str(t)) for n, t in orjson.loads(commit[DESCRIPTION]))


def query_of_app(table: Any, app_id: str) -> str | None:
    """The streaming query of the table's newest commit by ``app_id`` (the one that set its
    transaction version); None: not recorded."""
    commit = _newest_commit(table, lambda c: c.get(APP) == app_id)
    query = None if commit is None else commit.get(QUERY)
    return None if query is None else str(query)


def _pgdecode_commit(table: Any) -> dict[str, Any] | None:
    """The table's newest commit by pgdecode (it records the description), with the custom
    metadata it recorded; None: there is none."""
    return _newest_commit(table, lambda c: c.get(DESCRIPTION) is not None)


def _newest_commit(table: Any, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The newest commit of the table's history that is ``wanted`` (read from the newest
    back: most often the last commit is it)."""
    for limit in (1, 50, None):
        for commit in table.history(limit):
            if wanted(commit):
                return dict(commit)
    return None


def target_rows(table: Any, origins: pa.ChunkedArray | pa.Array, info: TableInfo, *,
                current: bool = False) -> pa.Table:
    """The rows of Delta table ``table`` whose first key column is among ``origins``:
    a superset of the rows under the keys fills take their values from."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    first = key_names(info)[0]
    dataset = delta_dataset(table)
    if isinstance(origins, pa.ChunkedArray):
        origins = origins.combine_chunks()
    wanted = _utc_array(origins)
    if pa.types.is_nested(wanted.type):  # no unique nor isin for lists: every row may
        where = ds.scalar(True)
    else:
        values = pc.unique(wanted.drop_null()).cast(dataset.schema.field(first).type)
        where = ds.field(first).isin(values)
        if pa.types.is_floating(values.type) and len(values):
            # the MERGE's IS NOT DISTINCT FROM takes NaN for NaN and -0 for 0; isin does not
            if pc.any(pc.is_nan(values)).as_py():
                where = where | pc.is_nan(ds.field(first))
            if pc.any(pc.equal(values, 0)).as_py():
                where = where | (ds.field(first) == 0)
        if wanted.null_count:
            where = where | ds.field(first).is_null()
    if current:  # a history: the current versions
        where = where & ds.field("_is_current")
    return dataset.to_table(filter=where)


def _utc_type(dtype: pa.DataType) -> pa.DataType:
    """Timestamps with a time zone as UTC (Delta's), in lists too."""
    import pyarrow as pa

    if pa.types.is_timestamp(dtype) and dtype.tz is not None:
        return pa.timestamp(dtype.unit, "UTC")
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        inner = _utc_type(dtype.value_type)
        if inner != dtype.value_type:
            return pa.large_list(inner) if pa.types.is_large_list(dtype) else pa.list_(inner)
    return dtype


def _utc_array(values: pa.Array) -> pa.Array:
    target = _utc_type(values.type)
    return values if target == values.type else values.cast(target)


def utc_table(table: pa.Table) -> pa.Table:
    import pyarrow as pa

    schema = pa.schema([f.with_type(_utc_type(f.type)) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)
