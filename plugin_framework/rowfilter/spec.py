"""What a publication says (PostgreSQL's pg_publication, pg_publication_rel): the tables
and schemas it lists, with their row filters and column lists, and the operations it
publishes; from the catalog or written by hand."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from plugin_framework.rowfilter.config import ALL_ACTIONS
from plugin_framework.rowfilter.errors import RowFilterError
from plugin_framework.rowfilter.expression import (
    parse_column_list,
    parse_filter,
    parse_table_name,
)
from plugin_framework.rowfilter.tables import CatalogTable

DML = ("insert", "update", "delete")
COPY = "copy"  # a snapshot's rows: copied whatever ``publish`` says, as tablesync.c does


@dataclass
class TableRule:
    """A table as a publication lists it: FOR TABLE t (columns) WHERE (row_filter)."""

    name: str  # as given: "schema.table"
    row_filter: str | None = None
    columns: tuple[str, ...] | None = None
    relid: int | None = None  # resolved from the catalog


@dataclass
class PublicationSpec:
    """One publication: from the catalog, or written by hand (``others``: every table not
    listed is published too, without filter, as if listed)."""

    name: str
    publish: frozenset[str] = ALL_ACTIONS
    via_root: bool = False
    all_tables: bool = False
    schemas: frozenset[str] = frozenset()
    tables: list[TableRule] = field(default_factory=list)
    others: bool = False
    from_catalog: bool = False  # defined on the server, which guards its DML itself

    def __post_init__(self) -> None:
        bad = set(self.publish) - ALL_ACTIONS
        if bad:
            raise RowFilterError(
                f'unrecognized value for publication option "publish": "{sorted(bad)[0]}"')
        self.publish = frozenset(self.publish)

    def rule(self, table: CatalogTable) -> TableRule | None:
        for r in self.tables:
            if r.relid is not None:
                if r.relid == table.relid:
                    return r
            elif _same_name(r.name, table):
                return r
        return None

    def lists(self, table: CatalogTable) -> bool:
        """Whether the table is in the publication by itself (FOR TABLE, TABLES IN SCHEMA, or
        an ``others`` specification)."""
        return self.others or table.schema in self.schemas or self.rule(table) is not None


def _same_name(name: str, table: CatalogTable) -> bool:
    schema, rel = parse_table_name(name)
    return rel == table.name and (schema or "public") == table.schema



def spec_publication(row_filters: Mapping[str, str],
                     column_lists: Mapping[str, Sequence[str] | str],
                     publish: Iterable[str] = ALL_ACTIONS, via_root: bool = False,
                     name: str = "pgdecode", others: bool = True) -> PublicationSpec:
    """A hand-written specification as a publication (of every table, with ``others``)."""
    rules: dict[str, TableRule] = {}
    for table, text in row_filters.items():
        parse_table_name(table)
        try:
            parse_filter(text)
        except RowFilterError as exc:
            raise exc.with_context(f'row filter of table "{table}"') from None
        rules.setdefault(table, TableRule(table)).row_filter = text
    for table, cols in column_lists.items():
        parse_table_name(table)
        names = parse_column_list(cols) if isinstance(cols, str) else list(cols)
        if not names:
            raise RowFilterError(f'empty column list for table "{table}"')
        rules.setdefault(table, TableRule(table)).columns = tuple(names)
    return PublicationSpec(name, frozenset(a.strip().lower() for a in publish), via_root,
                           tables=list(rules.values()), others=others)

