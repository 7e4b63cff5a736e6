"""Codec properties that need no server: round trips, strictness, hostile input."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.strategies import control, transactional

from plugin_framework.protocol import (
    ID_AFTER_TAG,
    LSN,
    ROW_CHANGE_TAGS,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    InvalidFieldError,
    LogicalMessage,
    MessageTag,
    Origin,
    Prepare,
    ProtocolError,
    RelationColumn,
    RelationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TruncatedMessageError,
    TupleData,
    TupleKind,
    Type,
    UnexpectedMessageError,
    UnknownMessageTypeError,
    Update,
    decode_copy_data,
    decode_standby_status,
    encode,
    encode_copy_data,
    id_after_tag,
    is_row_change,
)
from plugin_framework.protocol.cheader import c_header
from plugin_framework.protocol.framing import PrimaryKeepalive, StandbyStatusUpdate, XLogData

versions = st.integers(1, 4)


@given(versions.flatmap(lambda v: st.tuples(st.just(v), control(v))))
def test_control_messages_round_trip(version_and_message: tuple[int, object]) -> None:
    version, message = version_and_message
    data = encode(message)  # type: ignore[arg-type]
    assert Decoder(version).decode(data) == message
    assert encode(Decoder(version).decode(data)) == data


@given(transactional(in_stream=False))
def test_messages_outside_streams_round_trip(message: object) -> None:
    data = encode(message)  # type: ignore[arg-type]
    assert Decoder(1).decode(data) == message


@given(st.integers(2, 4), st.integers(0, 2**32 - 1), transactional(in_stream=True))
def test_messages_inside_streams_carry_their_xid(version: int, xid: int, message: object) -> None:
    decoder = Decoder(version)
    assert decoder.decode(encode(StreamStart(xid, True))) == StreamStart(xid, True)
    data = encode(message)  # type: ignore[arg-type]
    assert decoder.decode(data) == message
    assert decoder.decode(b"E") == StreamStop()
    assert not decoder.in_stream


def test_lsn_text_form_and_order() -> None:
    assert str(LSN(0x16B3748)) == "0/16B3748"
    assert LSN("1/0") == 1 << 32
    assert LSN("0/FFFFFFFF") < LSN("1/0")
    assert repr(LSN("A/B")) == "LSN('A/B')"
    with pytest.raises(ValueError, match="X/X"):
        LSN("16B3748")


@given(st.integers(0, 2**64 - 1))
def test_lsn_text_round_trip(value: int) -> None:
    assert LSN(str(LSN(value))) == value


@settings(max_examples=500)
@given(versions, st.binary(max_size=64))
def test_arbitrary_bytes_only_raise_protocol_errors(version: int, data: bytes) -> None:
    for in_stream in (False, True):
        decoder = Decoder(version)
        decoder.in_stream = in_stream and version >= 2
        with contextlib.suppress(ProtocolError):
            decoder.decode(data)


@settings(max_examples=300)
@given(versions.flatmap(lambda v: st.tuples(st.just(v), control(v) | transactional(False))),
       st.data())
def test_truncations_raise_protocol_errors(version_and_message: tuple[int, object],
                                           data: st.DataObject) -> None:
    version, message = version_and_message
    full = encode(message)  # type: ignore[arg-type]
    cut = data.draw(st.integers(0, len(full) - 1))
    # The one prefix that is itself a whole message: a protocol 4 Stream Abort without its
    # optional abort LSN and time.
    assume(not (isinstance(message, StreamAbort) and message.abort_lsn is not None
                and cut == 9))
    with pytest.raises(ProtocolError):
        Decoder(version).decode(full[:cut])


@given(st.binary(max_size=40))
def test_framing_only_raises_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_copy_data(data)


def test_framing_round_trip() -> None:
    at = datetime(2026, 11, 21, 5, 0, 1, 123456, tzinfo=UTC)
    for message in (
        XLogData(LSN("0/16B3748"), LSN("0/16B3800"), at, b"E"),
        PrimaryKeepalive(LSN("1/2"), at, True),
    ):
        assert decode_copy_data(encode_copy_data(message)) == message
    status = StandbyStatusUpdate(LSN("0/1"), LSN("0/2"), LSN("0/3"), at)
    assert decode_standby_status(encode_copy_data(status)) == status


# --- specific malformations, each with the reason it is rejected ----------------------------

INSERT = encode(Insert(16384, TupleData(b"tn", (b"42", None))))


def test_unknown_message_type() -> None:
    with pytest.raises(UnknownMessageTypeError, match=r"unknown message type 'Z'") as info:
        Decoder(4).decode(b"Z\0\0")
    assert info.value.offset == 0


def test_unknown_column_kind_names_the_column_and_offset() -> None:
    bad = INSERT.replace(b"n", b"x")
    with pytest.raises(InvalidFieldError, match="unknown column kind 'x' of column 1") as info:
        Decoder(1).decode(bad)
    assert info.value.offset == bad.index(b"x")


def test_value_length_past_the_end() -> None:
    bad = INSERT[:8] + b"t\x00\x00\x10\x00" + b"42n"
    with pytest.raises(TruncatedMessageError, match="value of column 0"):
        Decoder(1).decode(bad)


def test_truncated_tuple() -> None:
    with pytest.raises(TruncatedMessageError, match=f"ends after {len(INSERT) - 1} bytes"):
        Decoder(1).decode(INSERT[:-1])


def test_trailing_bytes() -> None:
    with pytest.raises(InvalidFieldError, match="1 unexpected trailing bytes"):
        Decoder(1).decode(INSERT + b"\0")


def test_nonzero_must_be_zero_flags() -> None:
    commit = bytearray(encode(Decoder(1).decode(
        b"C" + bytes(1) + LSN(5).to_bytes(8, "big") * 2 + bytes(8)
    )))
    commit[1] = 4
    with pytest.raises(InvalidFieldError, match="unrecognized flags 4, expected 0"):
        Decoder(1).decode(bytes(commit))


def test_update_with_both_old_key_and_old_tuple() -> None:
    row = INSERT[6:]
    bad = b"U" + INSERT[1:5] + b"K" + row + b"O" + row + b"N" + row
    with pytest.raises(InvalidFieldError, match="old key and old tuple both present"):
        Decoder(1).decode(bad)


def test_stream_only_messages_outside_a_stream() -> None:
    with pytest.raises(UnexpectedMessageError, match="Stream Stop outside a stream block"):
        Decoder(2).decode(b"E")


def test_stream_messages_need_protocol_2() -> None:
    with pytest.raises(UnexpectedMessageError, match="needs protocol version 2"):
        Decoder(1).decode(encode(StreamStart(7, True)))


def test_transaction_control_inside_a_stream_block() -> None:
    decoder = Decoder(2)
    decoder.decode(encode(StreamStart(7, True)))
    begin = encode(Begin(LSN(10), datetime(2026, 1, 1, tzinfo=UTC), 7))
    with pytest.raises(UnexpectedMessageError, match="inside a stream block"):
        decoder.decode(begin)
    assert decoder.in_stream  # a rejected message leaves the state as it was


def test_zero_lsn_where_postgresql_requires_one() -> None:
    with pytest.raises(InvalidFieldError, match=r"final_lsn is not set \(0/0\)"):
        Decoder(1).decode(b"B" + bytes(20))


def test_stream_abort_info_only_with_protocol_4() -> None:
    long_abort = b"A" + bytes(8) + bytes(16)
    with pytest.raises(InvalidFieldError, match="expected 9 for protocol version 3"):
        Decoder(3).decode(long_abort)
    assert Decoder(4).decode(long_abort).abort_lsn == LSN(0)  # type: ignore[union-attr]


def test_protocol_error_message_is_readable() -> None:
    with pytest.raises(ProtocolError) as info:
        Decoder(1).decode(INSERT[:3])
    assert str(info.value) == (
        "malformed Insert message at byte 3: message ends after 3 bytes while reading "
        "relation id and tuple marker"
    )


# --- message tags ----------------------------------------------------------------------------

# A message of every type, by the C name of its tag (PostgreSQL's LogicalRepMsgType).
_AT = datetime(2026, 1, 1, tzinfo=UTC)
_ROW = TupleData(b"t", (b"1",))
EVERY_MESSAGE = {
    MessageTag.BEGIN: Begin(LSN(10), _AT, 7),
    MessageTag.COMMIT: Commit(LSN(10), LSN(20), _AT),
    MessageTag.ORIGIN: Origin(LSN(5), "upstream"),
    MessageTag.INSERT: Insert(16384, _ROW),
    MessageTag.UPDATE: Update(16384, _ROW, key=_ROW),
    MessageTag.DELETE: Delete(16384, key=_ROW),
    MessageTag.TRUNCATE: Truncate((16384,), False, True),
    MessageTag.RELATION: RelationMessage(16384, "public", "t", "d",
                                         (RelationColumn(True, "id", 23, -1),)),
    MessageTag.TYPE: Type(16400, "public", "mood"),
    MessageTag.MESSAGE: LogicalMessage(True, LSN(9), "p", b"x"),
    MessageTag.BEGIN_PREPARE: BeginPrepare(LSN(10), LSN(20), _AT, 7, "g"),
    MessageTag.PREPARE: Prepare(LSN(10), LSN(20), _AT, 7, "g"),
    MessageTag.COMMIT_PREPARED: CommitPrepared(LSN(30), LSN(40), _AT, 7, "g"),
    MessageTag.ROLLBACK_PREPARED: RollbackPrepared(LSN(20), LSN(40), _AT, _AT, 7, "g"),
    MessageTag.STREAM_START: StreamStart(7, True),
    MessageTag.STREAM_STOP: StreamStop(),
    MessageTag.STREAM_COMMIT: StreamCommit(7, LSN(10), LSN(20), _AT),
    MessageTag.STREAM_ABORT: StreamAbort(7, 8),
    MessageTag.STREAM_PREPARE: StreamPrepare(LSN(10), LSN(20), _AT, 7, "g"),
}


def test_message_tags_are_postgresqls() -> None:
    """LogicalRepMsgType in src/include/replication/logicalproto.h, member for member."""
    assert {t.c_name: t.char for t in MessageTag} == {
        "LOGICAL_REP_MSG_BEGIN": "B", "LOGICAL_REP_MSG_COMMIT": "C",
        "LOGICAL_REP_MSG_ORIGIN": "O", "LOGICAL_REP_MSG_INSERT": "I",
        "LOGICAL_REP_MSG_UPDATE": "U", "LOGICAL_REP_MSG_DELETE": "D",
        "LOGICAL_REP_MSG_TRUNCATE": "T", "LOGICAL_REP_MSG_RELATION": "R",
        "LOGICAL_REP_MSG_TYPE": "Y", "LOGICAL_REP_MSG_MESSAGE": "M",
        "LOGICAL_REP_MSG_BEGIN_PREPARE": "b", "LOGICAL_REP_MSG_PREPARE": "P",
        "LOGICAL_REP_MSG_COMMIT_PREPARED": "K", "LOGICAL_REP_MSG_ROLLBACK_PREPARED": "r",
        "LOGICAL_REP_MSG_STREAM_START": "S", "LOGICAL_REP_MSG_STREAM_STOP": "E",
        "LOGICAL_REP_MSG_STREAM_COMMIT": "c", "LOGICAL_REP_MSG_STREAM_ABORT": "A",
        "LOGICAL_REP_MSG_STREAM_PREPARE": "p",
    }
    assert {chr(k) for k in TupleKind} == {"n", "u", "t", "b"}


@pytest.mark.parametrize("tag", list(MessageTag), ids=lambda t: t.name)
def test_every_tag_encodes_and_decodes(tag: MessageTag) -> None:
    message = EVERY_MESSAGE[tag]
    data = encode(message)
    assert data[0] == tag
    decoder = Decoder(4)
    if tag == MessageTag.STREAM_STOP:
        decoder.in_stream = True
    assert decoder.decode(data) == message


def test_errors_name_the_tag() -> None:
    with pytest.raises(UnknownMessageTypeError) as unknown:
        Decoder(4).decode(b"Z\0\0")
    assert "'Z'" in str(unknown.value) and unknown.value.tag is None
    with pytest.raises(UnexpectedMessageError, match=r"'S' \(Stream Start, "
                       r"LOGICAL_REP_MSG_STREAM_START\) needs protocol version 2") as early:
        Decoder(1).decode(encode(StreamStart(7, True)))
    assert early.value.tag is MessageTag.STREAM_START
    with pytest.raises(TruncatedMessageError) as short:
        Decoder(1).decode(INSERT[:3])
    assert short.value.tag is MessageTag.INSERT


@given(st.binary(max_size=12))
def test_raw_helpers_agree_with_the_decoder(data: bytes) -> None:
    for tag in (MessageTag.INSERT, MessageTag.UPDATE, MessageTag.DELETE):
        assert is_row_change(bytes((tag,)) + data) == (len(data) >= 4)
    assert is_row_change(b"B" + data) is False
    for message in (EVERY_MESSAGE[MessageTag.INSERT], EVERY_MESSAGE[MessageTag.UPDATE],
                    EVERY_MESSAGE[MessageTag.DELETE]):
        raw = encode(message)
        assert is_row_change(raw) and id_after_tag(raw) == 16384
        streamed = encode(replace(message, xid=4242))
        assert is_row_change(streamed) and id_after_tag(streamed) == 4242
    assert frozenset(b"IUD") == ROW_CHANGE_TAGS
    assert ID_AFTER_TAG.size == 4


def test_the_c_header_is_generated_from_the_tags() -> None:
    """plugin_framework/protocol/native/pgoutput_tags.h is committed; regenerate it with
    ``python -m plugin_framework.protocol.cheader --c-header
    plugin_framework/protocol/native/pgoutput_tags.h``."""
    header = (Path(__file__).resolve().parents[2] / "plugin_framework" / "protocol"
              / "native" / "pgoutput_tags.h")
    assert header.read_text(encoding="ascii") == c_header()
    for tag in MessageTag:
        assert f"#define PGOUTPUT_MSG_{tag.name} " in c_header()


# --- the C TupleData reader (protocol/native/_tuples.c) against the Python one it mirrors -----

@pytest.mark.native
def test_the_c_tuple_reader_is_built() -> None:
    """`pip install` compiles it; without it, the tests below would compare nothing."""
    from plugin_framework.protocol import tuples

    assert tuples.c_read_tuple is not None


def _tuple_bytes() -> st.SearchStrategy[bytes]:
    """Well-formed TupleData (of every column kind) followed by anything."""
    column = st.one_of(st.just(b"n"), st.just(b"u"),
                       st.tuples(st.sampled_from([b"t", b"b"]), st.binary(max_size=20)).map(
                           lambda kv: kv[0] + len(kv[1]).to_bytes(4, "big") + kv[1]))
    return st.builds(lambda cols, tail: len(cols).to_bytes(2, "big") + b"".join(cols) + tail,
                     st.lists(column, max_size=12), st.binary(max_size=4))


@pytest.mark.native
@settings(max_examples=1500, deadline=None)
@given(st.one_of(_tuple_bytes(), st.binary(max_size=40),
                 _tuple_bytes().flatmap(lambda raw: st.integers(0, len(raw)).map(
                     lambda cut: raw[:cut]))),
       st.binary(min_size=1, max_size=3))  # a message's type byte, at least, comes first
def test_c_tuple_reader_equals_the_python_one(raw: bytes, head: bytes) -> None:
    """Where the Python reader reads a tuple, the C one reads the same kinds, values and end;
    where it raises, the C one returns None (and the Python one then raises, as before)."""
    from plugin_framework.protocol import tuples

    data = head + raw
    found = tuples.c_read_tuple(data, len(head))
    try:
        expected, end = tuples.read_tuple_py(data, len(head))
    except ProtocolError:
        assert found is None
        return
    assert found is not None
    assert (found[0], found[1], found[2]) == (expected.kinds, expected.values, end)
    assert type(found[0]) is bytes and all(v is None or type(v) is bytes for v in found[1])
