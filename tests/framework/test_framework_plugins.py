"""Loading and validating plugins, and the context's output rules (no server needed)."""

from __future__ import annotations

import inspect
import types
from typing import Any

import pytest

from plugin_framework import LSN, MemoryOutput, OutputPlugin, OutputType, Pipeline, hookimpl
from plugin_framework.framework import LoadedPlugin, OutputError, PluginLoadError, hookspecs
from plugin_framework.framework.callbacks import CALLBACK_ARGS, CALLBACK_TABLE
from plugin_framework.protocol import (
    Begin,
    Commit,
    Insert,
    RelationColumn,
    RelationMessage,
    TupleData,
    encode,
)
from plugin_framework.protocol.pgtime import PG_EPOCH


class Minimal(OutputPlugin):
    def begin(self, ctx: Any, txn: Any) -> None: ...
    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None: ...
    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None: ...


def test_minimal_plugin_loads_with_only_its_callbacks() -> None:
    loaded = LoadedPlugin(Minimal())
    assert set(loaded.callbacks) == {"begin", "change", "commit"}
    assert not loaded.streaming and not loaded.two_phase
    assert loaded.name == "Minimal"


def test_hookspecs_are_the_callback_table() -> None:
    """hookspecs.py documents the callbacks of callbacks.py: the same names, the same
    argument names in the same order, and a docstring for each."""
    specs = {name: fn for name, fn in vars(hookspecs).items()
             if inspect.isfunction(fn) and hasattr(fn, f"{hookspecs.PROJECT}_spec")}
    assert set(specs) == set(CALLBACK_ARGS)
    for name, fn in specs.items():
        assert tuple(inspect.signature(fn).parameters) == CALLBACK_ARGS[name], name
        assert (fn.__doc__ or "").strip(), f"hookspec {name} has no docstring"


def test_the_callback_table_names_every_c_callback_literally() -> None:
    """Every callback but pgdecode's own maps to its OutputPluginCallbacks member, which is
    its name with _cb (written out in the table, so that grep finds it)."""
    for name, cb in CALLBACK_TABLE.items():
        if name == "fast_change":
            assert cb.c_member is None and cb.c_type is None
            continue
        assert cb.c_member == f"{name}_cb"
        assert cb.c_type is not None and cb.c_type.startswith("LogicalDecode")
        assert cb.c_type.endswith("CB")


@pytest.mark.parametrize("missing", ["begin", "change", "commit"])
def test_required_callbacks(missing: str) -> None:
    attrs = {n: (lambda self, *a: None) for n in ("begin", "change", "commit") if n != missing}
    cls = type("P", (OutputPlugin,), attrs)
    with pytest.raises(PluginLoadError,
                       match=f"output plugins have to register a {missing} callback"):
        LoadedPlugin(cls())


def test_any_stream_callback_requires_the_stream_set() -> None:
    cls = type("P", (Minimal,), {"stream_message": lambda self, *a: None})
    with pytest.raises(PluginLoadError,
                       match="logical streaming requires a stream_start_cb callback"):
        LoadedPlugin(cls())


def test_any_two_phase_callback_requires_the_two_phase_set() -> None:
    cls = type("P", (Minimal,), {"filter_prepare": lambda self, *a: False,
                                 "begin_prepare": lambda self, *a: None})
    with pytest.raises(PluginLoadError, match="logical replication at prepare time requires a "
                                              "prepare_cb callback"):
        LoadedPlugin(cls())


def test_streaming_and_two_phase_require_stream_prepare() -> None:
    noop = lambda self, *a: None  # noqa: E731
    attrs = {n: noop for n in ("stream_start", "stream_stop", "stream_abort", "stream_commit",
                               "stream_change", "begin_prepare", "prepare", "commit_prepared",
                               "rollback_prepared")}
    with pytest.raises(PluginLoadError, match="logical streaming at prepare time requires a "
                                              "stream_prepare_cb callback"):
        LoadedPlugin(type("P", (Minimal,), attrs)())
    attrs["stream_prepare"] = noop
    loaded = LoadedPlugin(type("P", (Minimal,), attrs)())
    assert loaded.streaming and loaded.two_phase


def test_misspelled_method_is_rejected() -> None:
    cls = type("P", (Minimal,), {"comit": lambda self, *a: None})
    with pytest.raises(PluginLoadError, match='method "comit" is not an output plugin callback '
                                              r'\(did you mean "commit"\?\)'):
        LoadedPlugin(cls())
    cls = type("P", (Minimal,), {"begin_cb": lambda self, *a: None})
    with pytest.raises(PluginLoadError, match='did you mean "begin"'):
        LoadedPlugin(cls())


def test_helper_methods_are_allowed() -> None:
    cls = type("P", (Minimal,), {"format_row": lambda self, row: "", "counter": 0})
    assert set(LoadedPlugin(cls()).callbacks) == {"begin", "change", "commit"}


def _hook_module(**fns: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{k: hookimpl(v) for k, v in fns.items()})


def test_hookimpl_plugins_and_subset_arguments() -> None:
    seen: list[Any] = []
    plugin = _hook_module(
        begin=lambda txn: seen.append(("begin", txn.xid)),
        change=lambda ctx, change: seen.append(("change", change.new.text("id"))),
        commit=lambda ctx, txn, commit_lsn: seen.append(("commit", commit_lsn)),
    )
    pipeline = Pipeline(proto_version=1)
    pipeline.add(plugin, name="hooks", output=MemoryOutput())
    pipeline.startup()
    at = PG_EPOCH
    rel = RelationMessage(16384, "public", "t", "d", (RelationColumn(True, "id", 23, -1),))
    for message in (Begin(LSN(100), at, 7), rel, Insert(16384, TupleData(b"t", (b"5",))),
                    Commit(LSN(100), LSN(120), at)):
        pipeline.handle(message, LSN(90))
    assert seen == [("begin", 7), ("change", "5"), ("commit", LSN(100))]


def test_misspelled_hookimpl_is_rejected() -> None:
    plugin = _hook_module(begin=lambda txn: None, change=lambda change: None,
                          comit=lambda txn: None)
    with pytest.raises(PluginLoadError, match="comit"):
        LoadedPlugin(plugin, "hooks")


class Writer(Minimal):
    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        if ctx.output_plugin_options.get("binary"):
            options.output_type = OutputType.BINARY

    def begin(self, ctx: Any, txn: Any) -> None:
        ctx.prepare_write()
        ctx.out += b"\xff\xfe"
        ctx.write()


def _one_transaction(pipeline: Pipeline) -> None:
    pipeline.startup()
    pipeline.handle(Begin(LSN(100), PG_EPOCH, 7), LSN(90))
    pipeline.handle(Commit(LSN(100), LSN(120), PG_EPOCH), LSN(100))


def test_textual_output_refuses_invalid_utf8_binary_accepts_it() -> None:
    pipeline = Pipeline(proto_version=1)
    pipeline.add(Writer(), output=MemoryOutput())
    with pytest.raises(Exception, match="invalid UTF-8 at byte 0 in textual mode"):
        _one_transaction(pipeline)
    out = MemoryOutput()
    pipeline = Pipeline(proto_version=1)
    pipeline.add(Writer(), output=out, options={"binary": "1"})
    _one_transaction(pipeline)
    assert [(r.lsn, r.xid, r.data) for r in out.records] == [(LSN(90), 7, b"\xff\xfe")]
    assert pipeline.flush() == LSN(120)


def test_fast_change_is_asked_once_per_relation_per_transaction() -> None:
    """The optional fast_change callback is declared like the others, and its formatter
    writes the change's record in place of the change callback."""
    asked: list[str] = []

    class Fast(Minimal):
        def fast_change(self, ctx: Any, relation: Any) -> Any:
            asked.append(relation.name)
            return lambda data, lsn, txn: f"fast {txn.xid}".encode()

    assert LoadedPlugin(Fast()).has("fast_change")
    out = MemoryOutput()
    pipeline = Pipeline(proto_version=1)
    pipeline.add(Fast(), output=out)
    pipeline.startup()
    rel = RelationMessage(16401, "public", "t", "d", (RelationColumn(True, "id", 20, -1),))
    lsn = 0x1000
    for data in [encode(rel)] + [
            encode(m) for xid in (7, 8) for m in (
                Begin(LSN(0x1000 * xid), PG_EPOCH, xid),
                Insert(16401, TupleData(b"t", (b"1",))), Insert(16401, TupleData(b"t", (b"2",))),
                Commit(LSN(0x1000 * xid), LSN(0x1000 * xid + 0x100), PG_EPOCH))]:
        lsn += 0x10
        pipeline.feed(data, LSN(lsn))
    assert asked == ["t", "t"]
    assert out.lines == ["fast 7", "fast 7", "fast 8", "fast 8"]


def test_writes_outside_callbacks_are_refused() -> None:
    pipeline = Pipeline(proto_version=1)
    ctx = pipeline.add(Minimal(), output=MemoryOutput())
    with pytest.raises(OutputError, match="outside of a callback"):
        ctx.prepare_write()


class Emitter(Minimal):
    def begin(self, ctx: Any, txn: Any) -> None:
        ctx.emit(ctx.output_plugin_options["data"].encode("latin-1"))


def test_emit_checks_bytes_in_textual_mode_like_write() -> None:
    pipeline = Pipeline(proto_version=1)
    pipeline.add(Emitter(), output=MemoryOutput(), options={"data": "\xff"})
    with pytest.raises(Exception, match="invalid UTF-8 at byte 0 in textual mode"):
        _one_transaction(pipeline)
    out = MemoryOutput()
    pipeline = Pipeline(proto_version=1)
    pipeline.add(Emitter(), output=out, options={"data": "ok"})
    _one_transaction(pipeline)
    assert [r.data for r in out.records] == [b"ok"]


def test_file_output_to_a_named_pipe_writes_as_to_a_pipe(tmp_path: Any) -> None:
    """A FIFO (or a device) is not a file that can be cut back and resumed: no progress file
    is made beside it, and lines go through as they would to stdout."""
    import os
    import threading

    from plugin_framework import LSN, FileOutput, OutputRecord

    fifo = tmp_path / "lines"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    output = FileOutput(str(fifo))
    output.write(OutputRecord(LSN(1), None, b"one"))
    output.mark(LSN(2))
    assert output.flush() == LSN(2)
    output.close()
    reader.join(10)
    assert received == [b"one\n"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines"]
