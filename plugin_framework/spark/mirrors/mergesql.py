"""The Spark SQL statements of the MERGE INTO mirror (mergeinto.py): each table's target name
from a template (``target_name``), the MERGE INTO of its staged net changes (``merge_sql``)
and the INSERT OVERWRITE of a batch that truncates it (``overwrite_sql``)."""

from __future__ import annotations

from collections.abc import Sequence

from plugin_framework.spark.columns.types import ident

__all__ = ["DELETED", "merge_sql", "overwrite_sql", "target_name"]

DELETED = "_deleted"  # the staged rows' flag: the key goes


def _parts(template: str) -> list[str]:
    """A multi-part name's parts, split at the dots outside backquotes (kept as written)."""
    parts, part, quoted, i = [], "", False, 0
    while i < len(template):
        c = template[i]
        if c == "`":
            if quoted and template[i + 1:i + 2] == "`":
                part += "``"
                i += 2
                continue
            quoted = not quoted
        if c == "." and not quoted:
            parts.append(part)
            part = ""
        else:
            part += c
        i += 1
    parts.append(part)
    return parts


def target_name(template: str, schema: str, table: str) -> str:
    """The target of table ``schema.table``: ``template``'s parts (``lake.{schema}.{table}``)
    with ``{schema}`` and ``{table}`` replaced by the names, each part that has one quoted
    whole, so that any name stays one part (``lake.`Odd Schema`.`a.b```)."""
    out = []
    for part in _parts(template):
        if "{" not in part:
            out.append(part)
            continue
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            part = part[1:-1].replace("``", "`")
        elif "`" in part:
            raise ValueError(f"{template!r}: quote a part with {{schema}} or {{table}} whole "
                             f"or not at all, not {part!r}")
        out.append(ident(part.format(schema=schema, table=table)))
    return ".".join(out)


def merge_sql(target: str, source: str, columns: Sequence[str], keys: Sequence[str]) -> str:
    """The MERGE INTO of a table's staged net changes (view or table ``source``: the
    ``columns``, then ``_deleted``) into ``target``, matched on ``keys``."""
    on = " AND ".join(f"t.{ident(k)} <=> s.{ident(k)}" for k in keys)
    sets = ", ".join(f"t.{ident(c)} = s.{ident(c)}" for c in columns)
    names = ", ".join(ident(c) for c in columns)
    values = ", ".join(f"s.{ident(c)}" for c in columns)
    return (f"MERGE INTO {target} AS t\n"
            f"USING {source} AS s\n"
            f"ON {on}\n"
            f"WHEN MATCHED AND s.{DELETED} THEN DELETE\n"
            f"WHEN MATCHED THEN UPDATE SET {sets}\n"
            f"WHEN NOT MATCHED AND NOT s.{DELETED} THEN INSERT ({names}) VALUES ({values})")


def overwrite_sql(target: str, source: str, columns: Sequence[str]) -> str:
    """The statement of a batch that truncates the table: its rows after the TRUNCATE, in
    place of all the target's."""
    names = ", ".join(ident(c) for c in columns)
    return f"INSERT OVERWRITE {target} ({names})\nSELECT {names} FROM {source} WHERE NOT {DELETED}"
