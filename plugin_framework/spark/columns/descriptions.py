"""What a batch says about each table (``TableInfo``: its newest description, from
``table_infos`` in Spark or ``rows_info`` from its rows), and a table's description
changing under a mirror (ALTER TABLE between changes): which column of an older description
is which of the newest.

pgoutput describes a table again (a Relation message) before its first change after the
description changed, by its columns' names and types in order, without their attribute
numbers. Two descriptions in a row differ by the DDL run between them:

- as many columns as before: a column with the same name is the same column (its type may
  have changed: the values are cast); one with another name but the same type, at the same
  place, was renamed (its values kept); another name and another type at one place cannot
  be told apart from a drop and an add: refused (SchemaChangeError);
- more or fewer columns: columns are matched by name (added ones are NULL in older rows,
  dropped ones leave the mirror).

A DROP COLUMN then an ADD COLUMN of the same type at the end, with no change of the table
between them, looks like a rename. The state keeps each column's PostgreSQL type in its
Spark field metadata (``pg_type``), so that a later batch knows the description it was
written with.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from plugin_framework.spark.changes.rows import TableRows

__all__ = ["Description", "SchemaChangeError", "TableInfo", "align_names", "columns_map",
           "describe_rows", "rows_info", "table_infos"]

Description = tuple[tuple[str, str], ...]  # (name, PostgreSQL type) of each column, in order


@dataclass(frozen=True)
class TableInfo:
    """What a batch says about one table."""

    schema: str
    table: str
    columns: tuple[tuple[str, str, bool], ...]  # name, PostgreSQL type, is key
    rows: int = 0
    primary: bool = False  # the key is known to tell rows apart, even if it is every column

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(name for name, _, key in self.columns if key)


def _columns(described: Any) -> tuple[tuple[str, str, bool], ...]:
    return tuple((c["name"], c["type"], bool(c["key"])) for c in described or ())


def table_infos(df: Any) -> list[TableInfo]:
    """The tables of a batch, with their newest description (one small Spark job)."""
    from pyspark.sql import functions as F

    rows = df.groupBy("schema", "table").agg(
        F.max_by("columns", F.struct("commit_lsn", "seq")).alias("columns"),
        F.count(F.lit(1)).alias("rows")).collect()
    infos = [TableInfo(r["schema"], r["table"], _columns(r["columns"]), int(r["rows"]))
             for r in rows]
    return sorted(infos, key=lambda i: (i.schema, i.table))


def rows_info(schema: str, table: str, rows: Sequence[dict[str, Any]]) -> TableInfo:
    """What ``table_infos`` says of a table, from its change rows of a batch (collected, in
    ``(commit_lsn, seq)`` order)."""
    if isinstance(rows, TableRows):  # not made dicts for this
        return TableInfo(schema, table, _columns(rows.columns[-1]) if rows.columns else (),
                         len(rows))
    return TableInfo(schema, table, _columns(rows[-1]["columns"]) if rows else (), len(rows))


class SchemaChangeError(ValueError):
    pass


def _step(table: str, old: Description, new: Description, guess: bool = True
          ) -> dict[str, str | None]:
    """Old column name -> new name (None: dropped) between two descriptions in a row. Not
    ``guess``ing (the table is read again: template.py), a column that has another name
    and type at its place is taken as dropped."""
    if len(old) != len(new):
        names = {name for name, _ in new}
        return {name: name if name in names else None for name, _ in old}
    out: dict[str, str | None] = {}
    for (n1, t1), (n2, t2) in zip(old, new, strict=True):
        if n1 != n2 and t1 != t2 and not guess:
            out[n1] = None
            continue
        if n1 != n2 and t1 != t2:
            raise SchemaChangeError(
                f"{table}: column {n1} ({t1}) is now {n2} ({t2}) at the same place, which "
                "pgoutput's description cannot tell from a column dropped and another added: "
                "deliver a change of the table between such ALTER TABLEs, or rebuild the "
                "mirror (a new snapshot)")
        out[n1] = n2
    return out


def columns_map(table: str, chain: Sequence[Description], guess: bool = True
                ) -> dict[str, str | None]:
    """The first description's column names -> the last's (None: dropped), through each
    description in between."""
    mapping: dict[str, str | None] = {name: name for name, _ in chain[0]} if chain else {}
    for old, new in itertools.pairwise(chain):
        if old == new:
            continue
        step = _step(table, old, new, guess)
        mapping = {first: None if now is None else step.get(now) for first, now in mapping.items()}
    return mapping


def description(columns: Any) -> Description:
    """A change row's ``columns`` (Arrow's to_pylist form) as a Description."""
    return tuple((c["name"], c["type"]) for c in columns or ())


def described(rows: Sequence[dict[str, Any]], stored: Description | None
              ) -> tuple[list[Description], list[Description]]:
    """Each row's description (of one table's change rows of a batch, in order), and the
    chain of descriptions from ``stored`` (if any) through each the rows have."""
    chain: list[Description] = [] if stored is None else [stored]
    if isinstance(rows, TableRows):  # each row's columns, converted once per distinct value
        converted: dict[int, Description] = {}
        for c in rows.columns:
            if id(c) not in converted:
                converted[id(c)] = description(c)
        each = [converted[id(c)] for c in rows.columns]
    else:
        each = [description(r["columns"]) for r in rows]
    for d in each:
        if not chain or chain[-1] != d:
            chain.append(d)
    return each, chain


def only_drops(chain: Sequence[Description]) -> bool:
    """Whether each description of ``chain`` is the one before with columns dropped (what
    the values a mirror holds carry over exactly)."""
    for old, new in itertools.pairwise(chain):
        kept = iter(old)
        if not all(any(column == c for c in kept) for column in new):
            return False
    return True


def describe_rows(table: str, rows: Sequence[dict[str, Any]], stored: Description | None,
                  guess: bool = True) -> tuple[Description, dict[str, str | None] | None]:
    """Rename the columns of ``rows`` (one table's change rows of a batch, in order) to the
    batch's newest description, in place; returns that description and the map of the
    ``stored`` description's columns (the state's) to it (None: none stored). ``guess``:
    as ``_step``'s."""
    each, chain = described(rows, stored)
    newest = chain[-1] if chain else ()
    if any(d != newest for d in each):  # (TableRows are made dicts only here)
        for row, d in zip(rows, each, strict=True):
            if d != newest:
                _rename(row, columns_map(table, chain[chain.index(d):], guess))
    state_map = None if stored is None else columns_map(table, chain, guess)
    return newest, state_map


def _rename(row: dict[str, Any], mapping: dict[str, str | None]) -> None:
    """A change row's maps and JSON objects under the newest names (dropped columns out)."""
    for name in ("key", "before", "after"):
        if row[name] is not None:
            row[name] = [(mapping[k], v) for k, v in row[name] if mapping.get(k) is not None]
    for name in ("before_json", "after_json"):
        if row[name] is not None:
            values = orjson.loads(row[name])
            row[name] = orjson.dumps({mapping[k]: v for k, v in values.items()
                                      if mapping.get(k) is not None}).decode()
    row["unchanged_toast"] = [mapping[c] for c in row["unchanged_toast"] or ()
                              if mapping.get(c) is not None]


def align_names(df: Any, info: Any) -> Any:
    """One table's change rows of a batch with the column names of its newest description in
    the batch (the maps' keys and the JSON objects' fields), in Spark: what
    ``describe_rows`` does in the driver, for ``split_tables`` and ``change_feed``."""
    from pyspark.sql import functions as F

    described = F.to_json(F.col("columns"))
    firsts = (df.groupBy(described.alias("d"))
              .agg(F.min(F.struct("commit_lsn", "seq")).alias("first")).collect())
    if len(firsts) < 2:
        return df
    texts = [r["d"] for r in sorted(firsts, key=lambda r: (r["first"][0], r["first"][1]))]
    chain = [description(orjson.loads(t)) for t in texts]
    renames = None
    for i, text in enumerate(texts[:-1]):
        mapping = columns_map(info.qualified_name, chain[i:])
        if all(old == new for old, new in mapping.items()):
            continue
        literal = F.create_map(*[F.lit(x) for kv in mapping.items() for x in kv])
        renames = (F.when(described == text, literal) if renames is None
                   else renames.when(described == text, literal))
    if renames is None:
        return df
    df = df.withColumn("_renames", renames)

    def renamed(m: Any) -> Any:
        kept = F.map_filter(m, lambda k, v: F.element_at(F.col("_renames"), k).isNotNull())
        return F.when(F.col("_renames").isNull(), m).otherwise(
            F.transform_keys(kept, lambda k, v: F.element_at(F.col("_renames"), k)))

    def renamed_json(text: Any) -> Any:
        # values as their JSON text (arrays stay parseable: typed_values reads them so)
        return F.when(F.col("_renames").isNull() | text.isNull(), text).otherwise(
            F.to_json(renamed(F.from_json(text, "map<string,string>"))))

    for name in ("key", "before", "after"):
        df = df.withColumn(name, renamed(F.col(name)))
    for name in ("before_json", "after_json"):
        df = df.withColumn(name, renamed_json(F.col(name)))
    toast = F.filter(F.transform("unchanged_toast",
                                 lambda c: F.element_at(F.col("_renames"), c)),
                     lambda c: c.isNotNull())
    df = df.withColumn("unchanged_toast", F.when(F.col("_renames").isNull(),
                                                 F.col("unchanged_toast")).otherwise(toast))
    return df.drop("_renames")
