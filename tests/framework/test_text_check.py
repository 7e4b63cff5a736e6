"""The textual-output check of a line or of a formatter's run of lines
(framework/native/_text.c) against its reference, Python's strict UTF-8 decoder
(``LogicalDecodingContext._check_textual``).

The C check decodes nothing: it must accept exactly what ``bytes.decode()`` accepts, find the
first line it refuses, and leave the error message to the Python check of that line.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.native import decodes

from plugin_framework import LSN
from plugin_framework.framework import CallbackError, MemoryOutput, OutputPlugin, Pipeline
from plugin_framework.framework import context as context_module
from plugin_framework.protocol import Insert, RelationColumn, RelationMessage, TupleData, encode

_text = pytest.importorskip("plugin_framework.framework.native._text",
                            reason="built without a C compiler")


def reference(lines: list[bytes]) -> int:
    return next((i for i, line in enumerate(lines) if not decodes(line)), -1)


# The edges of RFC 3629, where a validator goes wrong: each lead byte's first and last
# continuation, the overlong forms, surrogates, U+10FFFF and beyond, cut-off sequences.
_EDGES = [bytes([lead, second]) + tail
          for lead in (0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF,
                       0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF)
          for second in (0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0)
          for tail in (b"", b"\x80", b"\x80\x80", b"\xbf\xbf", b"a")]

pieces = st.one_of(
    st.binary(max_size=12),
    st.text(max_size=12).map(str.encode),  # valid: the common case
    st.sampled_from(_EDGES),
    st.integers(0, 0x10FFFF).filter(lambda c: not 0xD800 <= c <= 0xDFFF)
    .map(lambda c: chr(c).encode()),
)
# Lines long enough for the eight-byte ASCII steps, with what breaks them at any offset
line = st.lists(st.one_of(pieces, st.sampled_from([b"abcdefgh" * 3, b"x" * 7])), max_size=8
                ).map(b"".join)


@given(st.lists(line, max_size=12))
def test_first_invalid_line_is_the_decoders(lines: list[bytes]) -> None:
    assert _text.first_invalid_utf8(lines) == reference(lines)


@given(line)
def test_every_edge_alone_and_after_ascii(data: bytes) -> None:
    for prefix in (b"", b"a" * 5, b"b" * 8, b"c" * 13):
        assert (_text.first_invalid_utf8([prefix + data]) == -1) == decodes(prefix + data)
        assert _text.is_utf8(prefix + data) == decodes(prefix + data)


def test_the_edges_are_decided_as_the_decoder_does() -> None:
    for edge in _EDGES:
        assert (_text.first_invalid_utf8([edge]) == -1) == decodes(edge), edge
        assert _text.is_utf8(edge) == decodes(edge), edge
    # both outcomes occur: the list is not all valid or all invalid
    assert {decodes(edge) for edge in _EDGES} == {True, False}


def test_other_buffers_and_non_lists() -> None:
    assert _text.first_invalid_utf8([bytearray(b"ok"), memoryview(b"\xc3\xa9"), b"\xff"]) == 2
    # a view that cuts a sequence off, with the rest of it in the memory after the view
    assert _text.first_invalid_utf8([memoryview(b"ab\xc3\xa9")[:3]]) == 0
    assert _text.first_invalid_utf8([memoryview(b"\xf0\x9f\x98\x80")[:3]]) == 0
    assert not _text.is_utf8(memoryview(b"ab\xc3\xa9")[:3])
    assert _text.is_utf8(bytearray(b"\xc3\xa9"))
    with pytest.raises(TypeError):
        _text.first_invalid_utf8((b"a",))
    with pytest.raises(TypeError):
        _text.first_invalid_utf8(["text"])


class _Lines(OutputPlugin):
    """A plugin whose formatter writes the inserted value's text as it is, a run of lines at
    once (``lines``) or one line at a time: the context checks them as a textual plugin's
    output."""

    def __init__(self, runs: bool) -> None:
        self.runs = runs

    def begin(self, ctx: Any, txn: Any) -> None:
        pass

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        raise AssertionError("every change goes through lines")

    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        pass

    def fast_change(self, ctx: Any, relation: Any) -> Any:
        def write(data: bytes, lsn: LSN, txn: Any) -> bytes:
            return data[13:]  # 'I', relid, 'N', ncols, 't', length: the value

        def lines(datas: list[bytes], start: int, lsn: LSN, txn: Any
                  ) -> tuple[list[bytes], int]:
            return [write(d, lsn, txn) for d in datas[start:]], len(datas)

        if self.runs:
            write.lines = lines  # type: ignore[attr-defined]
        return write


def _snapshot(values: list[bytes], runs: bool) -> MemoryOutput:
    out = MemoryOutput()
    pipeline = Pipeline(proto_version=1)
    pipeline.add(_Lines(runs), output=out)
    pipeline.startup()
    rel = RelationMessage(16401, "public", "t", "d", (RelationColumn(True, "v", 25, -1),))
    pipeline.snapshot_rows(rel, [], [encode(Insert(16401, TupleData(b"t", (v,))))
                                     for v in values], LSN(0x100), datetime.now(UTC), mark=True)
    return out


@pytest.mark.parametrize("runs", [True, False], ids=["runs", "lines"])
@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_lines_are_held_to_textual_output(native: bool, runs: bool,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if not native:
        monkeypatch.setattr(context_module, "first_invalid_utf8", None)
        monkeypatch.setattr(context_module, "is_utf8", None)
    good = [b"plain", "caf\u00e9 \U0001f600".encode(), b"x" * 40]
    assert _snapshot(good, runs).lines == [v.decode() for v in good]
    # the message names the byte of the first bad line, whichever check found it
    with pytest.raises(CallbackError, match=r"invalid UTF-8 at byte 4 in textual mode"):
        _snapshot([*good, b"abcd\xed\xa0\x80", b"\xff"], runs)
