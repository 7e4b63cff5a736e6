"""Row filters and column lists, as PostgreSQL publications apply them, for any pipeline.

    >>> filters = PublicationFilters.from_publication(conninfo, "p1")
    >>> filters.install(pipeline)  # its changes and its snapshots' rows

or written by hand::

    >>> filters = PublicationFilters.from_spec(
    ...     conninfo, {"public.t1": "a > 5 AND c = 'NSW'"}, {"public.t1": ["a", "c"]})

Filters are parsed with PostgreSQL's grammar (pglast), resolved and checked against the
server's catalog the way CREATE PUBLICATION does (same rules, same messages), compiled into
Python closures and evaluated on the column values with PostgreSQL's semantics. Never eval.
See docs/row-filters.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugin_framework.rowfilter.config import (
    FilterConfig,
    add_cli_arguments,
    config_from_args,
    parse_config,
    read_config,
)
from plugin_framework.rowfilter.errors import (
    EvaluationError,
    NotSupportedError,
    RowFilterError,
)

if TYPE_CHECKING:
    from plugin_framework.rowfilter.publication import (
        PublicationFilters,
        from_cli_args,
        load_publication,
    )
    from plugin_framework.rowfilter.spec import PublicationSpec, TableRule

__all__ = [
    "EvaluationError", "FilterConfig", "NotSupportedError", "PublicationFilters",
    "PublicationSpec", "RowFilterError", "TableRule", "add_cli_arguments", "config_from_args",
    "from_cli_args", "load_publication", "parse_config", "read_config",
]

# The filters themselves (pglast's parser, the analyzer, the compilers) are imported when
# first asked for: every pgdecode command reads its filter options, few have filters, and
# those modules, with pglast, would add a third to a command's start-up
# (tests/package/test_startup.py).
_LAZY = {"PublicationFilters": "publication", "from_cli_args": "publication",
         "load_publication": "publication", "PublicationSpec": "spec", "TableRule": "spec"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
