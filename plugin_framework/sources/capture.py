"""The capture format: a replication stream recorded to a file, to replay without a server.

Layout of version 3, what is written (all integers big-endian):

    PGDECODE-CAPTURE 3\n
    <one line of JSON: proto_version, options, server_version, slot, created>\n
    uint32 CRC-32 of that line (its newline included)
    then, repeated: uint32 length, uint32 CRC-32 of the length's 4 bytes and the payload,
    and that many bytes of one CopyData payload exactly as the server sent it ('w' XLogData
    or 'k' keepalive).

Each frame's CRC-32 goes on from the one before it (the first from the header's): a frame
that is damaged, dropped, repeated or moved breaks the chain there, and is refused, naming
the frame and its offset, instead of replaying a different stream. A CRC-32 catches every
single-bit flip and every burst up to 32 bits. ``verify_capture`` reads a capture through
before anything of it is replayed: the chain, and the order of its messages (a Commit
without its Begin, a capture cut inside a transaction).

Version 2 (``PGDECODE-CAPTURE 2``) has a CRC-32 per frame, each on its own: a dropped or
repeated frame is found there only where it breaks the order of the messages. Version 1 has
no CRCs at all: damage that still decodes goes unnoticed. Both are still read.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from plugin_framework.framework.statecheck import Damage, TransactionBounds
from plugin_framework.protocol import (
    MAX_PROTO_VERSION,
    MIN_PROTO_VERSION,
    Decoder,
    PrimaryKeepalive,
    ProtocolError,
    RelationMessage,
    XLogData,
    decode_copy_data,
    encode_copy_data,
)
from plugin_framework.protocol.framing import XLOGDATA_HEADER_SIZE

MAGIC_V1 = b"PGDECODE-CAPTURE 1\n"  # no checksums: read, never written
MAGIC_V2 = b"PGDECODE-CAPTURE 2\n"  # a checksum per frame: read, never written
MAGIC = MAGIC_V3 = b"PGDECODE-CAPTURE 3\n"
_VERSIONS = {MAGIC_V1: 1, MAGIC_V2: 2, MAGIC_V3: 3}
_LEN = struct.Struct(">I")
_LEN_CRC = struct.Struct(">II")
_crc32 = zlib.crc32


class CaptureFormatError(ValueError):
    pass


@dataclass
class CaptureHeader:
    """The first frame of a capture file: how the stream it records was asked for."""

    proto_version: int
    options: dict[str, str] = field(default_factory=dict)
    server_version: int | None = None
    slot: str | None = None
    created: str | None = None


class CaptureWriter:
    def __init__(self, target: str | Path | IO[bytes], header: CaptureHeader) -> None:
        """``target``: a path, or a file opened for writing (at its start) that this takes
        over and closes."""
        self._file: IO[bytes] = (
            open(target, "wb")  # noqa: SIM115  (closed in close())
            if isinstance(target, str | Path) else target)
        line = json.dumps(asdict(header), sort_keys=True).encode() + b"\n"
        self._crc = _crc32(line)  # the chain of checksums starts from the header's
        self._file.write(MAGIC + line + _LEN.pack(self._crc))
        self.size = len(MAGIC) + len(line) + _LEN.size  # the bytes written so far

    def write(self, copy_data: bytes) -> None:
        length = _LEN.pack(len(copy_data))
        self._crc = _crc32(copy_data, _crc32(length, self._crc))
        self._file.write(_LEN_CRC.pack(len(copy_data), self._crc))
        self._file.write(copy_data)
        self.size += _LEN_CRC.size + len(copy_data)

    def take_back(self, size: int) -> None:
        """Take back the frames written after the first ``size`` bytes (a size this writer
        had): the capture then ends there, and nothing is written after."""
        self._file.flush()
        self._file.truncate(size)
        self.size = size

    def flush(self) -> None:
        self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SessionRecorder:
    """One session's stream into a capture (``pgdecode capture``): the header with the first
    message (``header`` makes it then: it holds what the connection told), then each message
    as it came. Closed inside a transaction or a stream block, the capture is cut back to
    the last place between them, as ``verify_capture`` sees it: the slot was told nothing of
    that transaction, so the next capture of the slot gets it whole."""

    def __init__(self, out: IO[bytes], header: Callable[[], CaptureHeader]) -> None:
        """``out``: opened for writing, empty; this takes it over and closes it."""
        self._out = out
        self._header = header
        self._writer: CaptureWriter | None = None
        self._bounds = TransactionBounds()
        self._whole = 0  # the capture's size at its last transaction boundary

    @property
    def started(self) -> bool:
        """Whether anything was recorded (the header is written with the first message)."""
        return self._writer is not None

    def write(self, message: XLogData | PrimaryKeepalive) -> None:
        writer = self._writer
        if writer is None:
            writer = self._writer = CaptureWriter(self._out, self._header())
        if not self._bounds.inside:
            self._whole = writer.size
        if type(message) is XLogData and message.data:
            self._bounds.add(message.data[0])
        writer.write(encode_copy_data(message))

    def sync(self) -> None:
        """What was recorded, on disk (before the slot is told it is done)."""
        if self._writer is not None:
            self._writer.flush()
            os.fsync(self._writer.fileno())

    def close(self) -> int | None:
        """Synced and closed; the size it was cut back to, if it ended inside a transaction."""
        writer, cut = self._writer, None
        if writer is None:
            self._out.close()
            return None
        try:
            if self._bounds.inside:
                writer.take_back(self._whole)
                cut = self._whole
            self.sync()
        finally:
            writer.close()
        return cut


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_header(raw: Any) -> CaptureHeader:
    """The header line's JSON, checked field by field: a replay trusts what it says."""
    if not isinstance(raw, dict):
        raise CaptureFormatError("not a JSON object")
    known = {f.name for f in fields(CaptureHeader)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CaptureFormatError(f'unknown field "{unknown[0]}"')
    if "proto_version" not in raw:
        raise CaptureFormatError('no "proto_version"')
    proto = raw["proto_version"]
    if not _is_int(proto) or not MIN_PROTO_VERSION <= proto <= MAX_PROTO_VERSION:
        raise CaptureFormatError(
            f'"proto_version" is {json.dumps(proto)}, not a pgoutput protocol version '
            f"({MIN_PROTO_VERSION} to {MAX_PROTO_VERSION})")
    options = raw.get("options", {})
    if not isinstance(options, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
        raise CaptureFormatError('"options" is not an object of strings')
    server_version = raw.get("server_version")
    if server_version is not None and (not _is_int(server_version) or server_version <= 0):
        raise CaptureFormatError(
            f'"server_version" is {json.dumps(server_version)}, not a server_version_num')
    for name in ("slot", "created"):
        if raw.get(name) is not None and not isinstance(raw[name], str):
            raise CaptureFormatError(f'"{name}" is not a string')
    return CaptureHeader(**raw)


def _read_header(f: IO[bytes], path: str | Path) -> tuple[CaptureHeader, int, int]:
    """The header, the capture's format version, and the header line's CRC-32."""
    magic = f.read(len(MAGIC))
    version = _VERSIONS.get(magic)
    if version is None:
        if magic[:-2] == MAGIC[:-2] and magic[-2:-1].isdigit() and magic[-1:] == b"\n":
            raise CaptureFormatError(
                f"{path} is a pgdecode capture of format version {magic[-2:-1].decode()}, "
                "which this pgdecode does not read (it reads versions 1 to 3): use a newer "
                "pgdecode")
        raise CaptureFormatError(f"{path} is not a pgdecode capture (no {MAGIC!r} header)")
    line = f.readline()
    crc = _crc32(line)
    if version >= 2:
        stored = f.read(_LEN.size)
        if len(stored) < _LEN.size or _LEN.unpack(stored)[0] != crc:
            raise CaptureFormatError(
                f"{path}: bad capture header: its checksum does not match (the file was "
                "damaged or changed after it was written)")
    try:
        return parse_header(json.loads(line)), version, crc
    except (ValueError, TypeError, RecursionError) as exc:  # CaptureFormatError, JSON, UTF-8
        raise CaptureFormatError(f"{path}: bad capture header: {exc}") from None


def read_header(path: str | Path) -> CaptureHeader:
    """The header of a capture, checked (CaptureFormatError): before anything is replayed."""
    with open(path, "rb") as f:
        return _read_header(f, path)[0]


Frame = tuple[int, int, bytes]  # its number (from 1), its offset in the file, its payload


def _open(path: str | Path) -> tuple[CaptureHeader, Iterator[Frame]]:
    """The header, and an iterator over the frames, each checked against its checksum (and,
    in version 3, against the chain from the frames before it)."""
    f = open(path, "rb")  # noqa: SIM115  (closed by the iterator)
    try:
        header, version, crc = _read_header(f, path)
    except BaseException:
        f.close()
        raise
    head_size = _LEN_CRC.size if version >= 2 else _LEN.size

    def frames() -> Iterator[Frame]:
        chain = crc if version >= 3 else 0
        with f:
            offset = f.tell()
            number = 1
            while head := f.read(head_size):
                where = f"frame {number} at byte {offset}"
                if len(head) < head_size:
                    raise CaptureFormatError(f"{path}: truncated frame header ({where})")
                (length,) = _LEN.unpack_from(head)
                payload = f.read(length)
                if len(payload) < length:
                    raise CaptureFormatError(f"{path}: truncated frame ({where})")
                if version >= 2:
                    computed = _crc32(payload, _crc32(head[:4], chain))
                    if _LEN.unpack_from(head, 4)[0] != computed:
                        why = ("the frame was damaged, or one before it is missing, repeated "
                               "or out of place" if version >= 3
                               else "the file was damaged or changed after it was written")
                        raise CaptureFormatError(
                            f"{path}: damaged {where}: its checksum does not match ({why})")
                    if version >= 3:
                        chain = computed
                yield number, offset, payload
                offset += head_size + length
                number += 1

    return header, frames()


def read_capture(path: str | Path) -> tuple[CaptureHeader, Iterator[XLogData | PrimaryKeepalive]]:
    """The header, and an iterator over the recorded messages."""
    header, frames = _open(path)

    def messages() -> Iterator[XLogData | PrimaryKeepalive]:
        for number, offset, payload in frames:
            try:
                yield decode_copy_data(payload)
            except ProtocolError as exc:
                raise CaptureFormatError(
                    f"{path}: damaged frame {number} at byte {offset}: {exc}") from None

    return header, messages()


@dataclass(frozen=True)
class Verified:
    """What ``verify_capture`` found: a capture whole up to its end (``damage`` None), or
    the damage that stops it (the whole transactions before it can be replayed): in frame
    number ``at``, or (None) at its end."""

    frames: int
    damage: str | None
    at: int | None = None


def verify_capture(path: str | Path) -> Verified:
    """Read a capture through before anything of it is replayed: every frame's checksum
    (and their chain), every frame a CopyData message, the messages in the order a server
    sends them, and an end at a transaction boundary (not inside a transaction or a stream
    block). A bad header is refused at once (CaptureFormatError)."""
    _, frames = _open(path)
    bounds = TransactionBounds()
    number = 0
    where = "its header"
    try:
        for number, offset, payload in frames:
            where = f"frame {number} at byte {offset}"
            if payload[:1] == b"w" and len(payload) > XLOGDATA_HEADER_SIZE:
                bounds.add(payload[XLOGDATA_HEADER_SIZE])  # the pgoutput message's tag
            else:
                decode_copy_data(payload)  # a keepalive, else ProtocolError
    except CaptureFormatError as exc:  # a checksum, a truncated frame: in the next one
        return Verified(number, str(exc).removeprefix(f"{path}: "), number + 1)
    except (Damage, ProtocolError) as exc:
        return Verified(number, f"damaged {where}: {exc}", number)
    if bounds.inside:
        return Verified(number, f"it ends inside a transaction, at {where} (it was cut short)")
    return Verified(number, None)


def described_relations(path: str | Path) -> Iterator[RelationMessage]:
    """The Relation messages of a capture, decoded (nothing else is): what a replay will learn
    of its tables, to check options against before replaying. A bad header is refused at
    once; a truncated or damaged frame when the iteration reaches it."""
    header, messages = read_capture(path)
    return _relations(header.proto_version, messages)


def _relations(proto_version: int,
               frames: Iterator[XLogData | PrimaryKeepalive]) -> Iterator[RelationMessage]:
    decoder = Decoder(proto_version)
    for frame in frames:
        if not isinstance(frame, XLogData) or not frame.data:
            continue
        tag = frame.data[0]
        if tag == 0x53 and proto_version >= 2:  # Stream Start: xids precede relations
            decoder.in_stream = True
        elif tag == 0x45 and proto_version >= 2:  # Stream Stop
            decoder.in_stream = False
        elif tag == 0x52:  # Relation
            message = decoder.decode(frame.data)
            assert isinstance(message, RelationMessage)
            yield message
