"""Row filters from a configuration file (TOML, or JSON) and from the command line."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugin_framework.rowfilter.errors import RowFilterError

# The operations a publication's ``publish`` option can name.
ALL_ACTIONS = frozenset({"insert", "update", "delete", "truncate"})


@dataclass
class FilterConfig:
    """Row filters, column lists and publish options as configured, not yet checked
    against a catalog."""

    row_filters: dict[str, str] = field(default_factory=dict)
    column_lists: dict[str, list[str] | str] = field(default_factory=dict)
    publish: frozenset[str] = ALL_ACTIONS
    via_root: bool = False
    publications: list[str] = field(default_factory=list)

    def merge(self, other: FilterConfig, source: str) -> None:
        for table, text in other.row_filters.items():
            if table in self.row_filters:
                raise RowFilterError(f'row filter for table "{table}" given twice ({source})')
            self.row_filters[table] = text
        for table, cols in other.column_lists.items():
            if table in self.column_lists:
                raise RowFilterError(f'column list for table "{table}" given twice ({source})')
            self.column_lists[table] = cols
        self.publications += [p for p in other.publications if p not in self.publications]

    def connection_reason(self) -> str | None:
        """Why these filters need a connection to the source database, None if they do not:
        publications are read from its catalog and row filters resolved with it, while column
        lists and publish options are matched by name against the stream's descriptions."""
        if self.publications:
            return f'publication "{self.publications[0]}" is read from the server'
        if self.row_filters:
            table = next(iter(self.row_filters))
            return (f'the row filter of table "{table}" is resolved with the server\'s catalog '
                    "(its columns, operators, functions and constants)")
        return None


_KEYS = {"tables", "publish", "publish_via_partition_root", "publications"}


def read_config(path: str | Path) -> FilterConfig:
    """Read a filter configuration::

        publications = ["p1"]              # optional: read from the server, ORed
        publish = ["insert", "update", "delete", "truncate"]
        publish_via_partition_root = false

        [tables."public.t1"]
        row_filter = "a > 5 AND c = 'NSW'"
        columns = ["a", "b", "c"]

    TOML unless the file name ends in .json (same structure).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise RowFilterError(f"cannot read filter configuration {str(p)!r}: "
                             f"{exc.strerror}") from None
    import tomllib  # (its regular expressions are compiled on import: only for a file)

    try:
        data = json.loads(raw) if p.suffix.lower() == ".json" else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise RowFilterError(f"invalid filter configuration {str(p)!r}: {exc}") from None
    return parse_config(data, str(p))


def parse_config(data: Any, source: str = "configuration") -> FilterConfig:
    if not isinstance(data, dict):
        raise RowFilterError(f"{source}: expected a table of settings")
    unknown = set(data) - _KEYS
    if unknown:
        raise RowFilterError(f"{source}: unknown setting {sorted(unknown)[0]!r} (expected "
                             f"{', '.join(sorted(_KEYS))})")
    cfg = FilterConfig()
    publish = data.get("publish", sorted(ALL_ACTIONS))
    if isinstance(publish, str):
        publish = [x for x in publish.split(",") if x.strip()]
    if not isinstance(publish, list) or not all(isinstance(x, str) for x in publish):
        raise RowFilterError(f"{source}: publish must be a list of operations")
    cfg.publish = frozenset(x.strip().lower() for x in publish)
    bad = cfg.publish - ALL_ACTIONS
    if bad:
        raise RowFilterError(f'{source}: unrecognized value for publication option "publish": '
                             f'"{sorted(bad)[0]}"')
    via = data.get("publish_via_partition_root", False)
    if not isinstance(via, bool):
        raise RowFilterError(f"{source}: publish_via_partition_root must be true or false")
    cfg.via_root = via
    pubs = data.get("publications", [])
    if isinstance(pubs, str):
        pubs = [pubs]
    if not isinstance(pubs, list) or not all(isinstance(x, str) for x in pubs):
        raise RowFilterError(f"{source}: publications must be a list of names")
    cfg.publications = list(pubs)
    tables = data.get("tables", {})
    if not isinstance(tables, dict):
        raise RowFilterError(f"{source}: tables must be a table of tables")
    for name, entry in tables.items():
        if not isinstance(entry, dict) or set(entry) - {"row_filter", "columns"}:
            raise RowFilterError(f'{source}: table "{name}" takes row_filter and columns')
        if "row_filter" in entry:
            if not isinstance(entry["row_filter"], str):
                raise RowFilterError(f'{source}: row_filter of "{name}" must be a string')
            cfg.row_filters[name] = entry["row_filter"]
        if "columns" in entry:
            cols = entry["columns"]
            if not (isinstance(cols, str) or (isinstance(cols, list)
                                              and all(isinstance(c, str) for c in cols))):
                raise RowFilterError(f'{source}: columns of "{name}" must be a list of names')
            cfg.column_lists[name] = cols
    return cfg


def split_table_arg(value: str, option: str) -> tuple[str, str]:
    """``schema.table:rest`` (the first colon outside double quotes separates)."""
    quoted = False
    for i, ch in enumerate(value):
        if ch == '"':
            quoted = not quoted
        elif ch == ":" and not quoted:
            table, rest = value[:i].strip(), value[i + 1:].strip()
            if table and rest:
                return table, rest
            break
    raise RowFilterError(f"{option} expects TABLE:VALUE, e.g. {option} "
                         + ("\"public.t1:(a > 5 AND c = 'NSW')\"" if option == "--row-filter"
                            else '"public.t1:a,b"') + f", not {value!r}")


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """The row-filter options of ``pgdecode stream`` and ``pgdecode replay``."""
    g = parser.add_argument_group(
        "row filters and column lists",
        "Filter changes as a PostgreSQL publication with row filters and column lists "
        "does (see docs/row-filters.md). Several sources are ORed, as several "
        "publications of a subscription.")
    g.add_argument("--row-filter", action="append", default=[], metavar="TABLE:(EXPR)",
                   help="replicate only the rows of TABLE for which EXPR is true, e.g. "
                        "\"public.t1:(a > 5 AND c = 'NSW')\" (repeatable)")
    g.add_argument("--column-list", action="append", default=[], metavar="TABLE:COL,...",
                   help="deliver only these columns of TABLE, e.g. \"public.t1:a,b\" "
                        "(repeatable)")
    g.add_argument("--filter-config", metavar="FILE",
                   help="row filters, column lists and publish options from a TOML (or .json) "
                        "file")
    g.add_argument("--filters-from-publication", action="append", default=[], metavar="NAME",
                   help="apply this publication's row filters, column lists and publish "
                        "options, read from the server (repeatable: ORed)")


def config_from_args(args: argparse.Namespace) -> FilterConfig | None:
    """The filter configuration the options give, None if they give none."""
    row_filters: Sequence[str] = getattr(args, "row_filter", None) or []
    column_lists: Sequence[str] = getattr(args, "column_list", None) or []
    config_file: str | None = getattr(args, "filter_config", None)
    pubs: Sequence[str] = getattr(args, "filters_from_publication", None) or []
    if not (row_filters or column_lists or config_file or pubs):
        return None
    cfg = read_config(config_file) if config_file else FilterConfig()
    cli = FilterConfig()
    for value in row_filters:
        table, expr = split_table_arg(value, "--row-filter")
        if table in cli.row_filters:
            raise RowFilterError(f'row filter for table "{table}" given twice')
        cli.row_filters[table] = expr
    for value in column_lists:
        table, cols = split_table_arg(value, "--column-list")
        if table in cli.column_lists:
            raise RowFilterError(f'column list for table "{table}" given twice')
        cli.column_lists[table] = cols
    cli.publications = list(pubs)
    cfg.merge(cli, "on the command line and in the configuration file")
    return cfg

