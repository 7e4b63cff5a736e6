"""Tables as the catalog describes them: columns, replica identity, partition ancestry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plugin_framework.rowfilter.errors import RowFilterError
from plugin_framework.rowfilter.parse_state import ColumnInfo, TableShape
from plugin_framework.rowfilter.pgcatalog import TypeCatalog


@dataclass(frozen=True)
class CatalogTable:
    """A table as the catalog describes it (pg_class, pg_attribute, pg_inherits), or as a
    Relation message does when there is no catalog: what publication rules, row filters and
    column lists are checked and compiled against."""

    relid: int
    schema: str
    name: str
    relkind: str  # r(egular), p(artitioned)...
    ispartition: bool
    replident: str  # d, n, f, i
    columns: tuple[ColumnInfo, ...]
    generated: frozenset[str]  # generated columns (not published unless listed)
    identity: frozenset[str]  # replica identity columns (all of them under FULL)
    ancestors: tuple[int, ...] = ()  # partition ancestors, nearest first
    type_names: dict[str, str] = field(default_factory=dict, compare=False)  # for Relations

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def shape(self) -> TableShape:
        return TableShape(self.schema, self.name, self.columns)

    @property
    def live_columns(self) -> int:
        """Columns a full column list would name (pgoutput_column_list_init's nliveatts)."""
        return sum(1 for c in self.columns if c.name not in self.generated)


class Tables:
    """Looks tables up in the catalog (cached)."""

    def __init__(self, catalog: TypeCatalog) -> None:
        self.cat = catalog
        self._by_oid: dict[int, CatalogTable | None] = {}

    def resolve_name(self, name: str) -> int:
        """The OID of a table named as in SQL (search_path applies), or a clear error."""
        try:
            rows = self.cat._rows("SELECT to_regclass(%s)::oid::int", (name,))
        except Exception as exc:
            raise RowFilterError(f'invalid table name "{name}": {exc}'.split("\n")[0]) \
                from None
        if not rows or rows[0][0] is None:
            raise RowFilterError(f'relation "{name}" does not exist')
        return int(rows[0][0])

    def get(self, relid: int) -> CatalogTable | None:
        if relid not in self._by_oid:
            self._by_oid[relid] = self._load(relid)
        return self._by_oid[relid]

    def require(self, relid: int) -> CatalogTable:
        info = self.get(relid)
        if info is None:
            raise RowFilterError(f"relation with OID {relid} does not exist")
        return info

    def _load(self, relid: int) -> CatalogTable | None:
        rows = self.cat._rows(
            "SELECT c.oid::int, n.nspname::text, c.relname::text, c.relkind::text, "
            "c.relispartition, c.relreplident::text FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s", (relid,))
        if not rows:
            return None
        oid, schema, name, relkind, ispartition, replident = rows[0]
        cols = self.cat._rows(
            "SELECT a.attname::text, a.atttypid::int, a.atttypmod, a.attcollation::int, "
            "a.attnum::int, a.attgenerated::text, format_type(a.atttypid, a.atttypmod) "
            "FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 "
            "AND NOT a.attisdropped ORDER BY a.attnum", (relid,))
        columns = tuple(ColumnInfo(r[0], r[1], r[2], r[3], r[4]) for r in cols)
        generated = frozenset(r[0] for r in cols if r[5])
        if replident == "f":
            identity = frozenset(c.name for c in columns)
        elif replident in ("d", "i"):
            flag = "indisprimary" if replident == "d" else "indisreplident"
            ident = self.cat._rows(
                "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a "
                "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey::int2[]) "
                f"WHERE i.indrelid = %s AND i.{flag}", (relid,))
            identity = frozenset(r[0] for r in ident)
        else:
            identity = frozenset()
        ancestors: tuple[int, ...] = ()
        if ispartition:
            anc = self.cat._rows("SELECT relid::oid::int FROM pg_partition_ancestors(%s)",
                                 (relid,))
            ancestors = tuple(r[0] for r in anc if r[0] != relid)
        self.cat.load_types([c.type_oid for c in columns])
        return CatalogTable(oid, schema, name, relkind, ispartition, replident, columns,
                            generated, identity, ancestors, {r[0]: r[6] for r in cols})

    def partitions(self, relid: int) -> list[int]:
        """Every partition under a partitioned table (all levels)."""
        rows = self.cat._rows(
            "SELECT relid::oid::int FROM pg_partition_tree(%s) WHERE relid <> %s::regclass",
            (relid, relid))
        return [r[0] for r in rows]

    def in_schema(self, schema: str) -> list[int]:
        rows = self.cat._rows(
            "SELECT c.oid::int FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p')", (schema,))
        return [r[0] for r in rows]

    def all_tables(self) -> list[int]:
        rows = self.cat._rows(
            "SELECT c.oid::int FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', "
            "'information_schema') AND n.nspname NOT LIKE 'pg\\_toast%%' "
            "AND c.relpersistence = 'p'", ())
        return [r[0] for r in rows]


def table_from_relation(relation: Any) -> CatalogTable:
    """What a Relation message tells of a table, when there is no catalog to ask."""
    columns = tuple(ColumnInfo(c.name, c.type_oid, c.type_modifier, 0, i + 1)
                    for i, c in enumerate(relation.columns))
    identity = frozenset(c.name for c in relation.columns if c.is_key)
    return CatalogTable(relation.relation_id, relation.namespace, relation.name, "r", False,
                        relation.replica_identity, columns, frozenset(), identity, (),
                        {c.name: c.type_name for c in relation.columns})
