"""The output-plugin framework: PostgreSQL's output-plugin API, driven by pgoutput."""

from __future__ import annotations

from plugin_framework.framework.catalog import Catalog, CatalogError
from plugin_framework.framework.context import (
    LogicalDecodingContext,
    OutputPluginOptions,
    OutputType,
)
from plugin_framework.framework.hookspecs import hookimpl
from plugin_framework.framework.model import (
    Action,
    Change,
    Column,
    Relation,
    Row,
    Transaction,
    TruncateChange,
)
from plugin_framework.framework.outputs import (
    FileOutput,
    MemoryOutput,
    Output,
    OutputError,
    OutputRecord,
)
from plugin_framework.framework.plugin import (
    LoadedPlugin,
    OutputPlugin,
    PluginLoadError,
    PluginMetric,
)
from plugin_framework.framework.reorder import (
    DEFAULT_MEMORY_LIMIT,
    CallbackError,
    Pipeline,
    PipelineError,
)
from plugin_framework.framework.spool import Spool, SpoolBudget
from plugin_framework.protocol import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    TupleData,
)

# Row.data is a TupleData: a kind per column (KIND_TEXT, KIND_NULL, KIND_UNCHANGED_TOAST,
# KIND_BINARY) and the raw values, for plugins that format the server's bytes without decoding.
# Spool and SpoolBudget hold output (or anything) in bounded memory, spilling to a file.
__all__ = [
    "DEFAULT_MEMORY_LIMIT", "KIND_BINARY", "KIND_NULL", "KIND_TEXT", "KIND_UNCHANGED_TOAST",
    "Action", "CallbackError", "Catalog", "CatalogError", "Change",
    "Column", "FileOutput", "LoadedPlugin", "LogicalDecodingContext", "MemoryOutput", "Output",
    "OutputError", "OutputPlugin", "OutputPluginOptions", "OutputRecord", "OutputType",
    "Pipeline", "PipelineError", "PluginLoadError", "PluginMetric", "Relation", "Row", "Spool",
    "SpoolBudget", "Transaction", "TruncateChange", "TupleData", "hookimpl",
]
