"""Pipeline assembly: the one place a Pipeline is put together from emitters, their options,
their outputs and the row filters, and a source is run through it. The command line
(``pgdecode stream``, ``replay``, ``demo``) and Spark's foreachBatch stream all assemble
their pipelines here.

    emitters = EmitterChoice(["json"], options=["pretty-print"], file_out="changes.jsonl")
    assembly = build_pipeline(emitters, slot_name="s", catalog_conninfo=dsn)
    run_source(open_source(config, assembly.pipeline), assembly)
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from plugin_framework.framework import Catalog, FileOutput, LoadedPlugin, OutputError, Pipeline
from plugin_framework.framework.output_protocol import DeliversElsewhere, capable
from plugin_framework.framework.registry import load_emitter
from plugin_framework.rowfilter import FilterConfig
from plugin_framework.sources.errors import explain
from plugin_framework.sources.session import SourceConfig
from plugin_framework.sources.sql import SqlSource
from plugin_framework.sources.walsender import WalsenderSource

if TYPE_CHECKING:
    from plugin_framework.rowfilter import PublicationFilters

log = logging.getLogger("pgdecode")

__all__ = [
    "Assembly", "EmitterChoice", "PlannedEmitter", "UsageError", "build_pipeline",
    "cannot_open", "open_output", "open_source", "parse_plugin_options", "run_source",
]


class UsageError(Exception):
    """Bad input from the user (the command line); the CLI prints it without a traceback and
    exits with status 2."""


class Source(Protocol):
    """What ``run_source`` drives: WalsenderSource, SqlSource."""

    def run(self) -> None: ...

    def request_stop(self) -> None: ...


class Status(Protocol):
    """A live report while a source runs (the CLI's status line)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def parse_plugin_options(pairs: Sequence[str],
                         emitters: Sequence[str]) -> dict[str, dict[str, str | None]]:
    """``-o NAME[=VALUE]`` options per emitter; ``-o EMITTER.NAME=VALUE`` scopes to one.

    An unscoped option goes to every emitter; ``-o NAME`` alone has the value None (true, for
    a boolean). A repeated option, or one with a control character (a newline pasted with
    a value, say), is an error.
    """
    per: dict[str, dict[str, str | None]] = {e: {} for e in emitters}
    for pair in pairs:
        control = next((c for c in pair if c < " " or c == "\x7f"), None)
        if control is not None:
            raise UsageError(f"option {pair!r} holds the control character {control!r} (a "
                             "line break pasted with the value?): give it on one line")
        name, eq, text = pair.partition("=")
        value = text if eq else None
        targets = list(emitters)
        scope, dot, rest = name.partition(".")
        if dot and scope in per:
            targets, name = [scope], rest
        if not name:
            raise UsageError(f"option {pair!r} has no name")
        for target in targets:
            if name in per[target]:
                raise UsageError(f'option "{name}" given twice for emitter "{target}"')
            per[target][name] = value
    return per


@dataclass(frozen=True)
class PlannedEmitter:
    """One member of a pipeline: the plugin (a loaded emitter, or an OutputPlugin), its
    options, and the file it writes (``-``: stdout) unless it brings its own output
    (``make_output``, as Spark's emitters do)."""

    plugin: Any
    options: dict[str, str | None] = field(default_factory=dict)
    target: str = "-"

    @property
    def make_output(self) -> Callable[[], Any] | None:
        """The plugin's own Output factory, if it delivers elsewhere (None: it writes to
        ``target``)."""
        inner = self.plugin.plugin if isinstance(self.plugin, LoadedPlugin) else self.plugin
        return inner.make_output if capable(inner, DeliversElsewhere) else None


@dataclass(frozen=True)
class EmitterChoice:
    """Emitters named by the user (``--emitter``, ``-o``, ``-f``, ``--emitter-allowlist``),
    loaded by ``load()``: each with its options, and its file (FILE.EMITTER each with
    several)."""

    names: Sequence[str] | None = None  # None or empty: the default
    options: Sequence[str] = ()
    file_out: str = "-"
    allowlist: Sequence[str] | None = None
    default: str = "json"

    @property
    def emitters(self) -> list[str]:
        return list(self.names or [self.default])

    def load(self) -> list[PlannedEmitter]:
        emitters = self.emitters
        if len(set(emitters)) != len(emitters):
            raise UsageError("an emitter can be named once; use -o EMITTER.NAME=VALUE to vary "
                             "options")
        options = parse_plugin_options(self.options, emitters)
        allow = list(self.allowlist) if self.allowlist is not None else None
        plan = []
        for name in emitters:
            target = self.file_out
            if len(emitters) > 1 and target != "-":
                target = f"{target}.{name}"  # one file per emitter
            plan.append(PlannedEmitter(load_emitter(name, allow), options[name], target))
        return plan


def cannot_open(target: str, exc: OSError, progress: bool = True) -> str:
    """An output file that cannot be opened: which, why, and what to do."""
    which = f" ({exc.filename})" if exc.filename and str(exc.filename) != target else ""
    beside = " (FILE.progress goes beside it)" if progress else ""
    return (f"cannot open {target} for writing{which}: {exc.strerror or exc}: give -f a file "
            f"in an existing directory that you can write to{beside}")


def open_output(target: str) -> FileOutput:
    """FileOutput(target), an error naming the file if it cannot be opened."""
    try:
        return FileOutput(target)
    except OSError as exc:
        raise OutputError(cannot_open(target, exc)) from None


@dataclass
class Assembly:
    """A pipeline with its row filters (closed with it)."""

    pipeline: Pipeline
    filters: PublicationFilters | None = None

    def start(self, *, slot_name: str | None, proto_version: int,
              server_version: int | None) -> None:
        """Start the plugins of a pipeline that no live source starts (a replay), telling
        them what the recorded server spoke. (A live source starts them itself, once
        connected: ``sources.session.start_pipeline``.)"""
        self.pipeline.slot_name = slot_name
        self.pipeline.set_proto_version(proto_version)
        self.pipeline.set_server_version(server_version)
        self.pipeline.startup(is_init=False)

    def close(self) -> None:
        """Shut the plugins down and close the outputs, then the filters' catalog."""
        self.pipeline.shutdown()
        if self.filters is not None:
            self.filters.close()


def row_filters(config: FilterConfig | None,
                conninfo: str | None) -> PublicationFilters | None:
    """The filters a configuration gives (None without one), checked against the catalog
    now. ``conninfo`` None: no catalog (a replay without -d), which is enough for column
    lists; what needs one is refused, saying to pass -d."""
    if config is None:
        return None
    if conninfo is None:
        reason = config.connection_reason()
        if reason is not None:
            raise UsageError(f"{reason}: pass -d CONNINFO, a connection to the database the "
                             "changes come from")
    from plugin_framework.rowfilter import PublicationFilters

    try:
        return PublicationFilters.from_config(config, conninfo)
    except psycopg.Error as exc:  # the catalog connection: refused, bad password...
        raise explain(exc, conninfo or "") from None


def build_pipeline(emitters: EmitterChoice | Sequence[PlannedEmitter], *,
                   slot_name: str | None = None, catalog_conninfo: str | None = None,
                   memory_limit: int | None = None, filters: FilterConfig | None = None,
                   filter_conninfo: str | None = None,
                   check: Callable[[PublicationFilters], None] | None = None,
                   before_output: Callable[[], object] | None = None,
                   output_files: list[tuple[Any, str]] | None = None) -> Assembly:
    """A Pipeline of ``emitters`` (loaded now if named), each writing to its file or to the
    Output it makes, with the row filters of ``filters`` (resolved with ``filter_conninfo``)
    as its change and truncate filters.

    In this order, so that what is wrong is refused before any output is opened and before
    anything is streamed or acknowledged: the filters, checked against the catalog; then
    ``check(filters)``; the emitters; ``before_output()``, a last check; the outputs.
    ``catalog_conninfo``: the catalog the emitters may query (None: none). ``memory_limit``
    (bytes): for reassembling transactions before spilling to disk. ``output_files``
    receives (output, file name) for each file opened, to name the file in an error.
    """
    publication_filters = row_filters(filters, filter_conninfo)
    opened: list[FileOutput] = []
    try:
        if publication_filters is not None and check is not None:
            check(publication_filters)
        plan = emitters.load() if isinstance(emitters, EmitterChoice) else list(emitters)
        if before_output is not None:
            before_output()
        kwargs: dict[str, Any] = {"slot_name": slot_name}
        if memory_limit:
            kwargs["memory_limit"] = memory_limit
        if catalog_conninfo is not None:
            kwargs["catalog"] = Catalog(catalog_conninfo)
        pipeline = Pipeline(**kwargs)
        for planned in plan:
            # An emitter that delivers elsewhere (Spark) brings its own Output, which says
            # when its work is durable; the others write to their file.
            if planned.make_output is not None:
                output = planned.make_output()
            else:
                output = open_output(planned.target)
                opened.append(output)
                if output_files is not None:
                    output_files.append((output, planned.target))
            pipeline.add(planned.plugin, options=planned.options, output=output)
    except BaseException:
        for opened_output in opened:  # unused: closing releases its lock, touches nothing
            with contextlib.suppress(Exception):
                opened_output.close()
        if publication_filters is not None:
            publication_filters.close()
        raise
    if publication_filters is not None:
        publication_filters.install(pipeline)
        pipeline.truncate_filter = publication_filters.truncate_filter
    return Assembly(pipeline, publication_filters)


def open_source(config: SourceConfig, pipeline: Pipeline,
                kind: str = "walsender") -> WalsenderSource | SqlSource:
    """The source that reads the slot: the replication connection (walsender) or the SQL
    functions (sql)."""
    if kind == "sql":
        return SqlSource(config, pipeline)
    return WalsenderSource(config, pipeline)


def run_source(source: Source, assembly: Assembly | None = None, *,
               status: Status | None = None, handle_signals: bool = True) -> None:
    """Run ``source`` until endpos, a stop request or an error, then close ``assembly``.

    With ``handle_signals`` (and in the main thread), SIGINT and SIGTERM mean: finish the
    transaction, acknowledge, return. ``status`` runs while the source does, and so does
    the source's ``monitor`` (sources/monitor.py: slot warnings, heartbeats)."""
    previous: dict[signal.Signals, Any] = {}

    def stop(signum: int, frame: Any) -> None:
        log.info("signal %d: stopping after this transaction", signum)
        source.request_stop()

    monitor = getattr(source, "monitor", None)
    try:
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, stop)
        if status is not None:
            status.start()
        try:
            if monitor is not None:
                monitor.start()
            source.run()
        finally:
            if monitor is not None:
                monitor.stop()
            if status is not None:
                status.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        if assembly is not None:
            assembly.close()

