"""pgdecode: PostgreSQL's logical-decoding output-plugin framework, driven by pgoutput.

Layers, imports pointing one way (docs/architecture.md; tests/package/test_layers.py holds them):

- ``plugin_framework.protocol``: the pgoutput codec (bytes in, typed messages out, and back).
- ``plugin_framework.pgtypes``: PostgreSQL values (OIDs, type names, quoting, converters).
- ``plugin_framework.framework``: output plugins, contexts, outputs, the reorder buffer.
- ``plugin_framework.rowfilter``: publication row filters and column lists.
- ``plugin_framework.sources``: the only code that talks to a server.
- ``plugin_framework.spark``, ``plugin_framework.app``, ``plugin_framework.cli``: Spark,
  pipeline assembly, the command.

The names a plugin author needs are re-exported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from plugin_framework._native import load_native, native_status  # (light: no framework)

if TYPE_CHECKING:
    from plugin_framework.framework import (
        Action,
        CallbackError,
        Change,
        Column,
        FileOutput,
        LogicalDecodingContext,
        MemoryOutput,
        OutputPlugin,
        OutputPluginOptions,
        OutputRecord,
        OutputType,
        Pipeline,
        PipelineError,
        PluginLoadError,
        Relation,
        Row,
        Transaction,
        TruncateChange,
        hookimpl,
    )
    from plugin_framework.protocol import LSN, UNCHANGED_TOAST

__all__ = [
    "LSN", "UNCHANGED_TOAST", "Action", "CallbackError", "Change", "Column", "FileOutput",
    "LogicalDecodingContext", "MemoryOutput", "OutputPlugin", "OutputPluginOptions",
    "OutputRecord", "OutputType", "Pipeline", "PipelineError", "PluginLoadError", "Relation",
    "Row", "Transaction", "TruncateChange", "__version__", "hookimpl", "load_native",
    "native_status",
]

_FROM_PROTOCOL = frozenset({"LSN", "UNCHANGED_TOAST"})


def __getattr__(name: str) -> Any:
    """The names re-exported here, imported when first used: ``pgdecode`` hides a password
    given in -d from ``ps`` before it loads the framework (and psycopg), which takes a few
    hundred milliseconds (cli/proctitle.py)."""
    if name not in __all__:
        raise AttributeError(f"module 'plugin_framework' has no attribute {name!r}")
    module = "plugin_framework.protocol" if name in _FROM_PROTOCOL else "plugin_framework.framework"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
