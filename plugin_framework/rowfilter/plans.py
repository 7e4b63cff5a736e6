"""Publications checked against the catalog as CREATE PUBLICATION checks them
(publicationcmds.c), and planned per table as pgoutput.c's get_rel_sync_entry does: which
operations, published as which relation, with which row filters and column list."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from plugin_framework.rowfilter.errors import EvaluationError, RowFilterError
from plugin_framework.rowfilter.expression import (
    FilterExpression,
    analyze_filter,
    parse_table_name,
)
from plugin_framework.rowfilter.pgcatalog import TypeCatalog
from plugin_framework.rowfilter.spec import COPY, DML, PublicationSpec, TableRule
from plugin_framework.rowfilter.tables import CatalogTable, Tables

log = logging.getLogger("pgdecode.rowfilter")


@dataclass
class RelationPlan:
    """What the publications do with one relation's changes."""

    table: CatalogTable  # the relation the changes are made to
    publish_as: CatalogTable  # the relation they are published as (the root, via the root)
    actions: frozenset[str]
    # per DML operation, and for the rows of a snapshot (COPY), the filters to OR; None:
    # unfiltered
    filters: dict[str, list[FilterExpression] | None]
    columns: tuple[str, ...] | None  # the column list; None: every column



class PublicationPlans:
    """Publications, checked against the catalog when built, and the plan of each table."""

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
        try:
            self._validate()
        except Exception:
            self.close()
            raise


    def close(self) -> None:
        if self._own_catalog and self.catalog is not None:
            self.catalog.close()

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
        candidates: dict[int, CatalogTable] = {}
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

    def _check_rule(self, pub: PublicationSpec, rule: TableRule, table: CatalogTable) -> None:
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
                   table: CatalogTable) -> FilterExpression:
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

    def _check_identity(self, table: CatalogTable) -> None:
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

    def _check_rule_identity(self, pub: PublicationSpec, rule: TableRule, table: CatalogTable,
                             publish_as: CatalogTable, ops: str, where: str) -> None:
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

    def _table(self, relid: int) -> CatalogTable:
        assert self.tables is not None
        return self.tables.require(relid)

    def _topmost_listing(self, pub: PublicationSpec,
                         table: CatalogTable) -> tuple[CatalogTable | None, int]:
        """GetTopMostAncestorInPublication: the topmost ancestor the publication lists, and
        its level."""
        top: CatalogTable | None = None
        level = 0
        for i, anc in enumerate(table.ancestors, 1):
            info = self._table(anc)
            if pub.lists(info):
                top, level = info, i
        return top, level

    def plan(self, table: CatalogTable) -> RelationPlan | None:
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
        if rel_pubs:  # (publishing no operation, it still has its rows copied)
            plan = RelationPlan(table, publish_as, frozenset(actions),
                                self._row_filters(rel_pubs, publish_as),
                                self._column_list(rel_pubs, publish_as))
        self._plans[table.relid] = plan
        return plan

    def _row_filters(self, pubs: list[PublicationSpec],
                     rel: CatalogTable) -> dict[str, list[FilterExpression] | None]:
        """pgoutput_row_filter_init: per operation, the filters to OR, or None. And under
        COPY, those of a table synchronization's copy (tablesync.c): of every publication,
        whatever it publishes (its ``publish`` is for changes only)."""
        kinds = (*DML, COPY)
        no_filter = dict.fromkeys(kinds, False)
        filters: dict[str, list[FilterExpression]] = {a: [] for a in kinds}
        for pub in pubs:
            rule = None
            if not pub.all_tables and rel.schema not in pub.schemas:
                rule = pub.rule(rel)
            if rule is None or rule.row_filter is None:
                for a in kinds:
                    no_filter[a] |= a in pub.publish or a == COPY
                if all(no_filter.values()):
                    break
                continue
            expr = self.expression(pub, rule, rel)
            for a in kinds:
                if (a in pub.publish or a == COPY) and not no_filter[a]:
                    filters[a].append(expr)
        return {a: None if no_filter[a] or not filters[a] else filters[a] for a in kinds}

    def _column_list(self, pubs: list[PublicationSpec],
                     rel: CatalogTable) -> tuple[str, ...] | None:
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

