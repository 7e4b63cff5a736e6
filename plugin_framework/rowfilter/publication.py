"""Publications as pgoutput applies them: which tables and operations are published, under
which relation, with which row filters (ORed across publications, per operation) and column
lists — get_rel_sync_entry, pgoutput_row_filter_init, pgoutput_column_list_init and
pgoutput_row_filter of PostgreSQL's pgoutput.c, applied to a stream of changes client-side.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from plugin_framework.framework.model import Action, Change, Column, Relation, Row
from plugin_framework.pgtypes import quote_ident_always
from plugin_framework.protocol import (
    KIND_BINARY,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    TupleData,
)
from plugin_framework.rowfilter.config import (
    ALL_ACTIONS,
    FilterConfig,
    config_from_args,
    read_config,
)
from plugin_framework.rowfilter.errors import EvaluationError, RowFilterError
from plugin_framework.rowfilter.evaluate import Compiled, Getter
from plugin_framework.rowfilter.functions import Infinity
from plugin_framework.rowfilter.pgcatalog import TypeCatalog
from plugin_framework.rowfilter.plans import PublicationPlans, RelationPlan
from plugin_framework.rowfilter.raw import RawFilter, raw_filter, raw_program
from plugin_framework.rowfilter.spec import (
    COPY,
    DML,
    PublicationSpec,
    TableRule,
    spec_publication,
)
from plugin_framework.rowfilter.tables import CatalogTable, table_from_relation

log = logging.getLogger("pgdecode.rowfilter")


_ACTION = {Action.INSERT: "insert", Action.UPDATE: "update", Action.DELETE: "delete"}


def load_publication(catalog: TypeCatalog, name: str) -> PublicationSpec:
    """A publication as the catalog defines it (pg_publication, pg_publication_rel with
    pg_get_expr(prqual) and prattrs, pg_publication_namespace)."""
    rows = catalog._rows(
        "SELECT p.oid::int, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, "
        "p.pubtruncate, p.pubviaroot FROM pg_publication p WHERE p.pubname = %s", (name,))
    if not rows:
        raise RowFilterError(f'publication "{name}" does not exist')
    oid, alltables, ins, upd, dele, trunc, viaroot = rows[0]
    publish = frozenset(a for a, on in zip(("insert", "update", "delete", "truncate"),
                                           (ins, upd, dele, trunc), strict=True) if on)
    rels = catalog._rows(
        "SELECT r.prrelid::int, n.nspname::text, c.relname::text, "
        "pg_get_expr(r.prqual, r.prrelid), "
        "(SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a "
        " WHERE a.attrelid = r.prrelid AND a.attnum = ANY(r.prattrs::int2[])) "
        "FROM pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE r.prpubid = %s "
        "ORDER BY r.prrelid", (oid,))
    schemas: frozenset[str] = frozenset()
    if catalog.server_version >= 150000:
        schemas = frozenset(r[0] for r in catalog._rows(
            "SELECT n.nspname::text FROM pg_publication_namespace pn "
            "JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE pn.pnpubid = %s", (oid,)))
    tables = [TableRule(f"{quote_ident_always(s)}.{quote_ident_always(t)}", qual,
                        tuple(cols) if cols else None, relid)
              for relid, s, t, qual, cols in rels]
    return PublicationSpec(name, publish, bool(viaroot), bool(alltables), schemas, tables,
                           from_catalog=True)


@dataclass
class _Compiled:
    """A plan compiled for one Relation object of the stream."""

    plan: RelationPlan
    predicates: dict[str, Callable[[Row, Row | None], bool] | None]
    out: Relation  # the relation the changes are delivered as
    positions: tuple[int, ...] | None  # the columns to deliver, from the incoming relation
    old_is_key: bool | None  # when publishing as another relation: its identity kind
    raw: RawFilter | None = None  # the same decisions on raw messages, where C makes them
    raw_copy: RawFilter | None = None  # those on a snapshot's rows (Insert messages)


class PublicationFilters(PublicationPlans):
    """Row filters, column lists and publish options of one or more publications (ORed as a
    subscription to several publications does), applied to a change stream.

    Use ``as_change_filter()`` for ``Pipeline.change_filter`` and ``truncate_filter`` for
    TRUNCATE. Everything that can be checked is checked when this is built: errors come
    before anything is streamed.
    """

    def __init__(self, publications: Sequence[PublicationSpec], conninfo: str | None = None,
                 *, catalog: TypeCatalog | None = None, own_catalog: bool | None = None) -> None:
        """``catalog``: a catalog connection to use (closed by ``close()`` if
        ``own_catalog``); else one is opened with ``conninfo`` (None: no catalog)."""
        self._compiled: dict[int, tuple[Relation, _Compiled | None]] = {}
        self._projected: dict[tuple[int, tuple[int, ...]], Relation] = {}
        super().__init__(publications, conninfo, catalog=catalog, own_catalog=own_catalog)

    # --- construction --------------------------------------------------------------------------

    @classmethod
    def from_publication(cls, conninfo: str, name: str | Sequence[str]) -> PublicationFilters:
        """The row filters, column lists and options of publications in the catalog."""
        catalog = TypeCatalog.connect(conninfo)
        try:
            names = [name] if isinstance(name, str) else list(name)
            pubs = [load_publication(catalog, n) for n in names]
        except Exception:
            catalog.close()
            raise
        return cls(pubs, catalog=catalog, own_catalog=True)

    @classmethod
    def from_spec(cls, conninfo: str | None, row_filters: Mapping[str, str] | None = None,
                  column_lists: Mapping[str, Sequence[str] | str] | None = None, *,
                  publish: Iterable[str] = ALL_ACTIONS,
                  publish_via_partition_root: bool = False,
                  publications: Sequence[str] = ()) -> PublicationFilters:
        """Filters written by hand: ``{"schema.table": "a > 5 AND c = 'NSW'"}`` and
        ``{"schema.table": ["a", "b"]}`` (or ``"a, b"``).

        Alone, this is a publication of every table, the named ones with their filter and
        column list. With ``publications`` (read from the catalog), it is one more
        publication of just the named tables, ORed with those."""
        spec = spec_publication(row_filters or {}, column_lists or {}, publish,
                                publish_via_partition_root, others=not publications)
        # "" is a connection string too: libpq's defaults (PGHOST, PGDATABASE...)
        catalog = TypeCatalog.connect(conninfo) if conninfo is not None else None
        try:
            pubs = [spec] if spec.tables else []
            if publications:
                if catalog is None:
                    raise RowFilterError("reading publications needs a connection")
                pubs += [load_publication(catalog, n) for n in publications]
            if not pubs:
                pubs = [spec]
        except Exception:
            if catalog is not None:
                catalog.close()
            raise
        return cls(pubs, catalog=catalog, own_catalog=True)

    @classmethod
    def from_config_file(cls, path: str, conninfo: str | None) -> PublicationFilters:
        """Filters from a TOML (or JSON, by extension) file; see docs/row-filters.md."""
        return cls.from_config(read_config(path), conninfo)

    @classmethod
    def from_config(cls, cfg: FilterConfig, conninfo: str | None) -> PublicationFilters:
        """The filters a configuration describes, checked against the catalog now
        (``conninfo`` None: without a catalog, see ``from_spec``)."""
        return cls.from_spec(conninfo, cfg.row_filters, cfg.column_lists, publish=cfg.publish,
                             publish_via_partition_root=cfg.via_root,
                             publications=cfg.publications)

    def __enter__(self) -> PublicationFilters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the change filter ---------------------------------------------------------------------

    def check(self, relation: Relation) -> None:
        """Prepare the filter of a table now: raises RowFilterError if the configuration
        cannot apply to it (a replay checks every table of its capture before it starts)."""
        self._for_relation(relation)

    def as_change_filter(self) -> Callable[[Change], Change | None]:
        """For ``Pipeline.change_filter``."""
        return self.filter_change

    def install(self, pipeline: Any) -> None:
        """Filter the pipeline's changes, and its snapshots' rows, as the publications do:
        ``filter_change`` and ``filter_snapshot_row``, and their raw forms in C."""
        pipeline.change_filter = self.filter_change
        pipeline.raw_change_filter = self.raw_filter_for
        pipeline.snapshot_change_filter = self.filter_snapshot_row
        pipeline.raw_snapshot_change_filter = self.raw_snapshot_filter_for

    def raw_filter_for(self, relation: Relation) -> RawFilter | None:
        """For ``Pipeline.raw_change_filter``: ``filter_change``'s decisions for the
        relation's changes taken on their raw messages, before they are decoded (raw.py), or
        None where C does not make them (a column list, a relation published as its
        partition root, an expression outside raw.py's, no C module)."""
        entry = self._for_relation(relation)
        if entry is None:  # not published: nothing of it is delivered
            return raw_filter(relation.relation_id, len(relation.columns), (), {})
        return entry.raw

    def raw_snapshot_filter_for(self, relation: Relation) -> RawFilter | None:
        """``raw_filter_for``, of ``filter_snapshot_row``."""
        entry = self._for_relation(relation)
        if entry is None:
            return raw_filter(relation.relation_id, len(relation.columns), (), {})
        return entry.raw_copy

    def _for_relation(self, relation: Relation) -> _Compiled | None:
        entry = self._compiled.get(id(relation))
        if entry is not None and entry[0] is relation:
            return entry[1]
        try:
            compiled = self._compile(relation)
        except psycopg.Error as exc:
            raise RowFilterError(f"reading the catalog failed: {str(exc).splitlines()[0]}",
                                 context=f'table "{relation.qualified_name}"') from exc
        self._compiled[id(relation)] = (relation, compiled)
        return compiled

    def _table_of(self, relation: Relation) -> CatalogTable:
        if self.tables is not None:
            info = self.tables.get(relation.relation_id)
            if info is not None and info.name == relation.name:
                return info
        return table_from_relation(relation)

    def _compile(self, relation: Relation) -> _Compiled | None:
        table = self._table_of(relation)
        if self.tables is None:
            self._check_identity_offline(table)
        plan = self.plan(table)
        if plan is None:
            if table.relkind == "p" and any(
                    p.lists(table) or p.all_tables or p.others for p in self.publications):
                raise RowFilterError(
                    f'changes of partitioned table "{table.qualified_name}" arrive under the '
                    "partition root, but the publications publish its partitions "
                    "(publish_via_partition_root is false): pgdecode cannot tell which "
                    "partition a row belongs to",
                    hint="Stream from a publication with publish_via_partition_root = false, "
                         "or filter with publish_via_partition_root = true.")
            return None
        where = f'table "{table.qualified_name}"'
        positions = relation.index
        predicates: dict[str, Callable[[Row, Row | None], bool] | None] = {}
        for action in (*DML, COPY):
            exprs = plan.filters.get(action)
            if not exprs:
                predicates[action] = None
                continue
            compiled = []
            for expr in exprs:
                for col in expr.columns:
                    i = positions.get(col)
                    if i is None:
                        raise RowFilterError(
                            f'column "{col}" used by the row filter is missing from the '
                            "stream's description of the table", context=where)
                    want = next(c.type_oid for c in expr.table.columns if c.name == col)
                    if relation.columns[i].type_oid != want:
                        raise RowFilterError(
                            f'column "{col}" changed type since the row filter was checked '
                            f"(now {relation.columns[i].type_name})", context=where)
                try:
                    compiled.append(expr.compile(positions))
                except RowFilterError as exc:
                    raise exc.with_context(f"row filter of {where}") from None
            predicates[action] = _predicate(compiled, where)
        out, cols = relation, None
        old_is_key: bool | None = None
        target = plan.publish_as
        if target.relid != table.relid:
            out, cols = self._as_relation(relation, target)
            old_is_key = target.replident != "f"
        elif plan.columns is not None:
            missing = [c for c in plan.columns if c not in positions]
            if missing:
                raise RowFilterError(f'column "{missing[0]}" of the column list is missing '
                                     "from the stream's description of the table",
                                     context=where)
            cols = tuple(sorted(positions[c] for c in plan.columns))
            out = self._project(relation, cols)
        if target.relid != table.relid and plan.columns is not None:
            keep = [i for i, c in enumerate(out.columns) if c.name in plan.columns]
            cols = tuple(cols[i] for i in keep) if cols is not None else tuple(keep)
            out = self._project(out, tuple(keep))
        raw = raw_copy = None
        if out is relation:
            raw = self._raw_filter(relation, plan.filters, DML, plan.actions)
            raw_copy = self._raw_filter(relation, {"insert": plan.filters[COPY]}, ("insert",),
                                        ("insert",))
        return _Compiled(plan, predicates, out, cols, old_is_key, raw, raw_copy)

    @staticmethod
    def _raw_filter(relation: Relation, filters: Mapping[str, list[Any] | None],
                    actions: Sequence[str], published: Iterable[str]) -> RawFilter | None:
        """The relation's filters of ``actions`` as C programs, when every one of them has
        one."""
        programs: dict[str, tuple[Any, ...] | None] = {}
        for action in actions:
            exprs = filters.get(action)
            if not exprs:
                programs[action] = None
                continue
            compiled = [raw_program(expr.tree, relation.index) for expr in exprs]
            if any(p is None for p in compiled):
                return None
            programs[action] = tuple(compiled)
        return raw_filter(relation.relation_id, len(relation.columns), sorted(published),
                          programs)

    def _check_identity_offline(self, table: CatalogTable) -> None:
        for pub in self.publications:
            rule = pub.rule(table)
            if (rule is None or rule.columns is None or not {"update", "delete"} & pub.publish
                    or pub.all_tables):
                continue
            missing = sorted(table.identity - set(rule.columns))
            unknown = [c for c in rule.columns if c not in {x.name for x in table.columns}]
            if unknown:
                raise RowFilterError(
                    f'column "{unknown[0]}" of relation "{table.name}" does not exist',
                    context=f'column list of table "{table.qualified_name}"')
            if missing or table.replident == "f":
                raise RowFilterError(
                    "a table with REPLICA IDENTITY FULL cannot have a column list"
                    if table.replident == "f" else
                    f'the column list does not include replica identity column '
                    f'"{missing[0]}"', context=f'column list of table "{table.qualified_name}" '
                    f'in publication "{pub.name}"', detail="Column list used by the "
                    "publication does not cover the replica identity.")

    def _project(self, relation: Relation, positions: tuple[int, ...]) -> Relation:
        key = (id(relation), positions)
        rel = self._projected.get(key)
        if rel is None:
            columns = tuple(relation.columns[i] for i in positions)
            rel = self._projected[key] = Relation(
                relation.relation_id, relation.namespace, relation.name,
                relation.replica_identity, columns, {c.name: i for i, c in enumerate(columns)})
        return rel

    def _as_relation(self, relation: Relation,
                     target: CatalogTable) -> tuple[Relation, tuple[int, ...]]:
        """The partition root a partition's changes are published as (by column name)."""
        names = [c.name for c in target.columns if c.name not in target.generated]
        key = (id(relation), (-target.relid,))
        rel = self._projected.get(key)
        if rel is None:
            bytype = {c.name: c for c in relation.columns}
            columns = tuple(
                Column(name, bytype[name].type_oid, bytype[name].type_modifier,
                       name in target.identity, target.type_names.get(name,
                                                                      bytype[name].type_name))
                for name in names)
            rel = self._projected[key] = Relation(
                target.relid, target.schema, target.name, target.replident, columns,
                {c.name: i for i, c in enumerate(columns)})
        return rel, tuple(relation.index[name] for name in names)

    def filter_change(self, change: Change) -> Change | None:
        """The change as the publications would publish it, or None."""
        entry = self._for_relation(change.relation)
        if entry is None:
            return None
        action = _ACTION[change.action]
        if action not in entry.plan.actions:
            return None
        predicate = entry.predicates[action]
        new_data = None
        if predicate is not None:
            if change.action == Action.INSERT:
                assert change.new is not None
                if not predicate(change.new, None):
                    return None
            elif change.action == Action.DELETE:
                assert change.old is not None
                if not predicate(change.old, None):
                    return None
            else:
                assert change.new is not None
                if change.old is None:
                    if not predicate(change.new, None):
                        return None
                else:
                    old_match = predicate(change.old, None)
                    new_match = predicate(change.new, change.old)
                    if not old_match and not new_match:
                        return None
                    if new_match and not old_match:
                        new_data = _merge_unchanged(change.new.data, change.old.data)
                        change = replace(change, action=Action.INSERT, old=None,
                                         old_is_key=False)
                    elif old_match and not new_match:
                        change = replace(change, action=Action.DELETE, new=None)
        return self._deliver(change, entry, new_data)

    def filter_snapshot_row(self, change: Change) -> Change | None:
        """A snapshot's row (an INSERT) as a table synchronization copies it, or None: under
        the row filters of every publication of the table, ORed, whatever operations they
        publish, and its column list."""
        entry = self._for_relation(change.relation)
        if entry is None:
            return None
        predicate = entry.predicates[COPY]
        if predicate is not None:
            assert change.new is not None
            if not predicate(change.new, None):
                return None
        return self._deliver(change, entry, None)

    def _deliver(self, change: Change, entry: _Compiled,
                 new_data: TupleData | None) -> Change:
        out = entry.out
        cols = entry.positions
        if out is change.relation and new_data is None:
            return change

        def row(data: TupleData | None) -> Row | None:
            if data is None:
                return None
            if cols is not None:
                data = TupleData(bytes(data.kinds[i] for i in cols),
                                 tuple(data.values[i] for i in cols))
            return Row(out, data)

        new = new_data if new_data is not None else (
            change.new.data if change.new is not None else None)
        old = change.old.data if change.old is not None else None
        old_is_key = change.old_is_key
        if entry.old_is_key is not None and old is not None:
            old_is_key = entry.old_is_key
        return replace(change, relation=out, new=row(new), old=row(old), old_is_key=old_is_key)

    def truncate_filter(self, relations: Sequence[Relation]) -> list[Relation]:
        """The relations of a TRUNCATE the publications publish (pgoutput_truncate): those
        that publish truncate, without partitions published via their root."""
        out = []
        for rel in relations:
            table = self._table_of(rel)
            plan = self.plan(table)
            if plan is None or "truncate" not in plan.actions:
                continue
            if table.ispartition and plan.publish_as.relid != table.relid:
                continue
            out.append(rel)
        return out




def _predicate(compiled: list[Compiled], where: str) -> Callable[[Row, Row | None], bool]:
    """The ORed filters on a row (unchanged TOAST values taken from ``fallback``): true only
    if one of them is true (false and NULL do not replicate)."""
    def predicate(row: Row, fallback: Row | None) -> bool:
        get = _getter(row, fallback, where)
        try:
            return any(c(get) is True for c in compiled)
        except RowFilterError as exc:
            raise exc.with_context(f"row filter of {where}") from None
        except (ArithmeticError, ValueError, TypeError, psycopg.DataError) as exc:
            raise EvaluationError(f"{type(exc).__name__}: {exc}",
                                  context=f"row filter of {where}") from exc
    return predicate


def _merge_unchanged(new: TupleData, old: TupleData) -> TupleData:
    """The new row with its unchanged TOAST values taken from the old row (where the old row
    has them), as pgoutput_row_filter builds the tuple of an UPDATE turned INSERT."""
    kinds = bytearray(new.kinds)
    values = list(new.values)
    changed = False
    for i, k in enumerate(new.kinds):
        if k == KIND_UNCHANGED_TOAST and i < len(old.kinds) and old.kinds[i] in (KIND_TEXT,
                                                                                KIND_BINARY):
            kinds[i] = old.kinds[i]
            values[i] = old.values[i]
            changed = True
    return TupleData(bytes(kinds), tuple(values)) if changed else new


def _getter(row: Row, fallback: Row | None, where: str) -> Getter:
    kinds = row.data.kinds
    cache: dict[int, Any] = {}

    def get(i: int) -> Any:
        if i in cache:
            return cache[i]
        src = row
        if kinds[i] == KIND_UNCHANGED_TOAST:
            if fallback is not None and fallback.data.kinds[i] in (KIND_TEXT, KIND_BINARY):
                src = fallback
            else:
                raise EvaluationError(
                    f'the row filter needs column "{row.relation.columns[i].name}", whose '
                    "value is an unchanged TOASTed value the server did not send",
                    context=f"row filter of {where}")
        try:
            value = src.value(i)
        except psycopg.DataError:
            raw = src.raw(i)
            if raw in (b"infinity", b"-infinity"):
                value = Infinity(-1 if raw.startswith(b"-") else 1)
            else:
                raise
        cache[i] = value
        return value
    return get


def from_cli_args(args: argparse.Namespace,
                  conninfo: str | None) -> PublicationFilters | None:
    """The PublicationFilters the options ask for (None when no filter option is given):
    checked against the catalog now, before anything is streamed."""
    cfg = config_from_args(args)
    return None if cfg is None else PublicationFilters.from_config(cfg, conninfo)
