"""Publications as pgoutput applies them: which tables and operations are published, under
which relation, with which row filters (ORed across publications, per operation) and column
lists — get_rel_sync_entry, pgoutput_row_filter_init, pgoutput_column_list_init and
pgoutput_row_filter of PostgreSQL's pgoutput.c, applied to a stream of changes client-side.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from plugin_framework.framework.model import Action, Change, Column, Relation, Row
from plugin_framework.framework.rowfilter.errors import EvaluationError, RowFilterError
from plugin_framework.framework.rowfilter.evaluate import Compiled, Getter
from plugin_framework.framework.rowfilter.expression import (
    FilterExpression,
    analyze_filter,
    parse_column_list,
    parse_filter,
    parse_table_name,
)
from plugin_framework.framework.rowfilter.functions import Infinity
from plugin_framework.framework.rowfilter.pgcatalog import TypeCatalog
from plugin_framework.framework.rowfilter.tables import TableInfo, Tables, table_from_relation
from plugin_framework.pgtypes import quote_ident_always as _q
from plugin_framework.protocol import (
    KIND_BINARY,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    TupleData,
)

log = logging.getLogger("pgdecode.rowfilter")

DML = ("insert", "update", "delete")
ALL_ACTIONS = frozenset({"insert", "update", "delete", "truncate"})
_ACTION = {Action.INSERT: "insert", Action.UPDATE: "update", Action.DELETE: "delete"}


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

    def rule(self, table: TableInfo) -> TableRule | None:
        for r in self.tables:
            if r.relid is not None:
                if r.relid == table.relid:
                    return r
            elif _same_name(r.name, table):
                return r
        return None

    def lists(self, table: TableInfo) -> bool:
        """Whether the table is in the publication by itself (FOR TABLE, TABLES IN SCHEMA, or
        an ``others`` specification)."""
        return self.others or table.schema in self.schemas or self.rule(table) is not None


def _same_name(name: str, table: TableInfo) -> bool:
    schema, rel = parse_table_name(name)
    return rel == table.name and (schema or "public") == table.schema


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
    tables = [TableRule(f"{_q(s)}.{_q(t)}", qual, tuple(cols) if cols else None, relid)
              for relid, s, t, qual, cols in rels]
    return PublicationSpec(name, publish, bool(viaroot), bool(alltables), schemas, tables,
                           from_catalog=True)


@dataclass
class RelationPlan:
    """What the publications do with one relation's changes."""

    table: TableInfo  # the relation the changes are made to
    publish_as: TableInfo  # the relation they are published as (the root, via the root)
    actions: frozenset[str]
    filters: dict[str, list[FilterExpression] | None]  # per DML operation; None: unfiltered
    columns: tuple[str, ...] | None  # the column list; None: every column


@dataclass
class _Compiled:
    """A plan compiled for one Relation object of the stream."""

    plan: RelationPlan
    predicates: dict[str, Callable[[Row, Row | None], bool] | None]
    out: Relation  # the relation the changes are delivered as
    positions: tuple[int, ...] | None  # the columns to deliver, from the incoming relation
    old_is_key: bool | None  # when publishing as another relation: its identity kind


class PublicationFilters:
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
        self._own_catalog = (catalog is None and conninfo is not None) if own_catalog is None \
            else own_catalog
        if not publications:
            if own_catalog and catalog is not None:
                catalog.close()
            raise RowFilterError("no publication to filter by")
        self.publications = list(publications)
        self.catalog = catalog if catalog is not None else (
            TypeCatalog.connect(conninfo) if conninfo is not None else None)
        self.tables = Tables(self.catalog) if self.catalog is not None else None
        self._expressions: dict[tuple[int, int], FilterExpression] = {}
        self._plans: dict[int, RelationPlan | None] = {}
        self._compiled: dict[int, tuple[Relation, _Compiled | None]] = {}
        self._projected: dict[tuple[int, tuple[int, ...]], Relation] = {}
        try:
            self._validate()
        except Exception:
            self.close()
            raise

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
        from plugin_framework.framework.rowfilter.config import read_config

        cfg = read_config(path)
        return cls.from_spec(conninfo, cfg.row_filters, cfg.column_lists, publish=cfg.publish,
                             publish_via_partition_root=cfg.via_root,
                             publications=cfg.publications)

    def close(self) -> None:
        if self._own_catalog and self.catalog is not None:
            self.catalog.close()

    def __enter__(self) -> PublicationFilters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- validation ----------------------------------------------------------------------------

    def _validate(self) -> None:
        if self.tables is None:
            for pub in self.publications:
                for rule in pub.tables:
                    if rule.row_filter is not None:
                        raise RowFilterError(
                            "row filters need a connection to the source database: pgdecode "
                            "resolves their columns, operators and functions with the "
                            "server's catalog",
                            context=f'row filter of table "{rule.name}"')
                    parse_table_name(rule.name)
            return
        candidates: dict[int, TableInfo] = {}
        for pub in self.publications:
            if pub.schemas and any(r.columns for r in pub.tables):
                rule = next(r for r in pub.tables if r.columns)
                raise RowFilterError(
                    f'cannot use column list for relation "{rule.name}" in publication '
                    f'"{pub.name}"', detail="Column lists cannot be specified in "
                    "publications containing FOR TABLES IN SCHEMA elements.")
            for rule in pub.tables:
                if rule.relid is None:
                    rule.relid = self.tables.resolve_name(rule.name)
                table = self.tables.require(rule.relid)
                self._check_rule(pub, rule, table)
                candidates[table.relid] = table
                if table.relkind == "p":
                    for part in self.tables.partitions(table.relid):
                        candidates[part] = self.tables.require(part)
        for table in candidates.values():
            self._check_identity(table)
            self.plan(table)  # analyzes the filters, checks the column lists

    def _check_rule(self, pub: PublicationSpec, rule: TableRule, table: TableInfo) -> None:
        where = f'table "{table.qualified_name}" in publication "{pub.name}"'
        if table.relkind == "p" and not pub.via_root:
            if rule.row_filter is not None:
                raise RowFilterError(
                    f'cannot use publication WHERE clause for relation "{table.name}"',
                    detail="WHERE clause cannot be used for a partitioned table when "
                           "publish_via_partition_root is false.", context=where)
            if rule.columns:
                raise RowFilterError(
                    f'cannot use column list for relation "{table.qualified_name}" in '
                    f'publication "{pub.name}"', detail="Column lists cannot be specified "
                    "for partitioned tables when publish_via_partition_root is false.")
        if rule.columns is not None:
            seen: set[str] = set()
            for col in rule.columns:
                info = next((c for c in table.columns if c.name == col), None)
                if info is None:
                    raise RowFilterError(
                        f'column "{col}" of relation "{table.name}" does not exist',
                        context=f"column list of {where}")
                if col in seen:
                    raise RowFilterError(f'duplicate column "{col}" in publication column '
                                         "list", context=f"column list of {where}")
                seen.add(col)
        if rule.row_filter is not None:
            self.expression(pub, rule, table)

    def expression(self, pub: PublicationSpec, rule: TableRule,
                   table: TableInfo) -> FilterExpression:
        key = (id(rule), table.relid)
        expr = self._expressions.get(key)
        if expr is None:
            assert self.catalog is not None and rule.row_filter is not None
            context = f'row filter of table "{table.qualified_name}" in publication ' \
                      f'"{pub.name}"'
            try:
                expr = analyze_filter(rule.row_filter, table, self.catalog)
                self._trial_compile(expr)
            except RowFilterError as exc:
                raise exc.with_context(context) from None
            except psycopg.Error as exc:
                raise RowFilterError(str(exc).split("\n")[0], context=context) from None
            self._expressions[key] = expr
        return expr

    @staticmethod
    def _trial_compile(expr: FilterExpression) -> None:
        """Compile once at configuration, so that what pgdecode cannot evaluate is said now.
        Errors the server raises only when it prepares the filter (a division by zero in a
        constant) are left for then."""
        with contextlib.suppress(EvaluationError):
            expr.compile({c.name: i for i, c in enumerate(expr.table.columns)})

    def _check_identity(self, table: TableInfo) -> None:
        """pub_rf_contains_invalid_column and pub_contains_invalid_column, for every
        publication that publishes UPDATE or DELETE of the table."""
        assert self.tables is not None
        for pub in self.publications:
            if not ({"update", "delete"} & pub.publish) or pub.all_tables:
                continue
            publish_as = table
            if pub.via_root and table.ispartition:
                top, _ = self._topmost_listing(pub, table)
                publish_as = top or table
            rule = pub.rule(publish_as)
            if rule is None:
                continue
            ops = " and ".join(a.upper() for a in ("update", "delete") if a in pub.publish)
            where = f'table "{table.qualified_name}" in publication "{pub.name}"'
            try:
                self._check_rule_identity(pub, rule, table, publish_as, ops, where)
            except RowFilterError as exc:
                if not pub.from_catalog:
                    raise
                # PostgreSQL accepted this publication: it refuses UPDATE and DELETE of the
                # table on the publisher instead ("cannot update table"), so none reach the
                # stream; pgoutput would evaluate the filter as it is. So does pgdecode.
                log.warning("%s", str(exc).replace("\n", " "))

    def _check_rule_identity(self, pub: PublicationSpec, rule: TableRule, table: TableInfo,
                             publish_as: TableInfo, ops: str, where: str) -> None:
        if rule.row_filter is not None and table.replident != "f":
            expr = self.expression(pub, rule, publish_as)
            bad = sorted(expr.columns - table.identity)
            if bad:
                raise RowFilterError(
                    f'the row filter uses column "{bad[0]}", which is not part of the '
                    "replica identity", context=f"row filter of {where}",
                    detail="Column used in the publication WHERE expression is not part "
                           "of the replica identity.",
                    hint=f"The publication publishes {ops}: its row filter may only use "
                         "replica identity columns (or set REPLICA IDENTITY FULL). "
                         "PostgreSQL refuses UPDATE and DELETE of such a table: "
                         f'cannot update table "{table.name}".')
        if rule.columns is not None:
            # Under REPLICA IDENTITY FULL no column list is allowed, even one naming every
            # column (pub_contains_invalid_column).
            missing = sorted(table.identity - set(rule.columns))
            if missing or table.replident == "f":
                raise RowFilterError(
                    "a table with REPLICA IDENTITY FULL cannot have a column list"
                    if table.replident == "f" else
                    f'the column list does not include replica identity column '
                    f'"{missing[0]}"', context=f"column list of {where}",
                    detail="Column list used by the publication does not cover the "
                           "replica identity.",
                    hint=f"The publication publishes {ops}: its column list must include "
                         "every replica identity column.")

    # --- planning (get_rel_sync_entry) ---------------------------------------------------------

    def _table(self, relid: int) -> TableInfo:
        assert self.tables is not None
        return self.tables.require(relid)

    def _topmost_listing(self, pub: PublicationSpec,
                         table: TableInfo) -> tuple[TableInfo | None, int]:
        """GetTopMostAncestorInPublication: the topmost ancestor the publication lists, and
        its level."""
        top: TableInfo | None = None
        level = 0
        for i, anc in enumerate(table.ancestors, 1):
            info = self._table(anc)
            if pub.lists(info):
                top, level = info, i
        return top, level

    def plan(self, table: TableInfo) -> RelationPlan | None:
        """What the publications do with changes to this relation; None: not published."""
        if table.relid in self._plans:
            return self._plans[table.relid]
        actions: set[str] = set()
        publish_as, level = table, 0
        rel_pubs: list[PublicationSpec] = []
        for pub in self.publications:
            publish, pub_rel, alevel = False, table, 0
            if pub.all_tables:
                publish = True
                if pub.via_root and table.ispartition and table.ancestors:
                    pub_rel, alevel = self._table(table.ancestors[-1]), len(table.ancestors)
            else:
                ancestor_published = False
                if table.ispartition and self.tables is not None:
                    top, lvl = self._topmost_listing(pub, table)
                    if top is not None:
                        ancestor_published = True
                        if pub.via_root:
                            pub_rel, alevel = top, lvl
                publish = pub.lists(table) or ancestor_published
            if publish and (table.relkind != "p" or pub.via_root):
                actions |= pub.publish
                if level > alevel:
                    continue
                if level < alevel:
                    publish_as, level, rel_pubs = pub_rel, alevel, []
                rel_pubs.append(pub)
        plan: RelationPlan | None = None
        if actions:
            plan = RelationPlan(table, publish_as, frozenset(actions),
                                self._row_filters(rel_pubs, publish_as),
                                self._column_list(rel_pubs, publish_as))
        self._plans[table.relid] = plan
        return plan

    def _row_filters(self, pubs: list[PublicationSpec],
                     rel: TableInfo) -> dict[str, list[FilterExpression] | None]:
        """pgoutput_row_filter_init: per operation, the filters to OR, or None."""
        no_filter = dict.fromkeys(DML, False)
        filters: dict[str, list[FilterExpression]] = {a: [] for a in DML}
        for pub in pubs:
            rule = None
            if not pub.all_tables and rel.schema not in pub.schemas:
                rule = pub.rule(rel)
            if rule is None or rule.row_filter is None:
                for a in DML:
                    no_filter[a] |= a in pub.publish
                if all(no_filter.values()):
                    break
                continue
            expr = self.expression(pub, rule, rel)
            for a in DML:
                if a in pub.publish and not no_filter[a]:
                    filters[a].append(expr)
        return {a: None if no_filter[a] or not filters[a] else filters[a] for a in DML}

    def _column_list(self, pubs: list[PublicationSpec], rel: TableInfo) -> tuple[str, ...] | None:
        """pgoutput_column_list_init: the publications must agree."""
        result: tuple[str, ...] | None = None
        first = True
        for pub in pubs:
            cols: tuple[str, ...] | None = None
            if not pub.all_tables:
                rule = pub.rule(rel)
                if rule is not None and rule.columns is not None:
                    ordered = tuple(c.name for c in rel.columns if c.name in rule.columns)
                    if self.tables is None:
                        ordered = tuple(rule.columns)
                    cols = None if len(ordered) == rel.live_columns else ordered
            if first:
                result, first = cols, False
            elif result != cols:
                raise RowFilterError(
                    f'cannot use different column lists for table "{rel.qualified_name}" in '
                    "different publications")
        return result

    # --- the change filter ---------------------------------------------------------------------

    def check(self, relation: Relation) -> None:
        """Prepare the filter of a table now: raises RowFilterError if the configuration
        cannot apply to it (a replay checks every table of its capture before it starts)."""
        self._for_relation(relation)

    def as_change_filter(self) -> Callable[[Change], Change | None]:
        """For ``Pipeline.change_filter``."""
        return self.filter_change

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

    def _table_of(self, relation: Relation) -> TableInfo:
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
        for action in DML:
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
        return _Compiled(plan, predicates, out, cols, old_is_key)

    def _check_identity_offline(self, table: TableInfo) -> None:
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
                     target: TableInfo) -> tuple[Relation, tuple[int, ...]]:
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
