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
from plugin_framework.framework.plugin import LoadedPlugin, OutputPlugin, PluginLoadError
from plugin_framework.framework.reorder import (
    DEFAULT_MEMORY_LIMIT,
    CallbackError,
    Pipeline,
    PipelineError,
)

__all__ = [
    "DEFAULT_MEMORY_LIMIT", "Action", "CallbackError", "Catalog", "CatalogError", "Change",
    "Column", "FileOutput", "LoadedPlugin", "LogicalDecodingContext", "MemoryOutput", "Output",
    "OutputError", "OutputPlugin", "OutputPluginOptions", "OutputRecord", "OutputType",
    "Pipeline", "PipelineError", "PluginLoadError", "Relation", "Row", "Transaction",
    "TruncateChange", "hookimpl",
]
