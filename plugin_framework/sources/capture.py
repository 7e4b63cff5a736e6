"""The capture format: a replication stream recorded to a file, to replay without a server.

Layout (all integers big-endian):

    PGDECODE-CAPTURE 1\n
    <one line of JSON: proto_version, options, server_version, slot, created>\n
    then, repeated: uint32 length, and that many bytes of one CopyData payload exactly as
    the server sent it ('w' XLogData or 'k' keepalive).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from plugin_framework.protocol import Decoder, PrimaryKeepalive, XLogData, decode_copy_data
from plugin_framework.protocol import Relation as RelationMessage

MAGIC = b"PGDECODE-CAPTURE 1\n"
_LEN = struct.Struct(">I")


class CaptureFormatError(ValueError):
    pass


@dataclass
class CaptureHeader:
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
        self._file.write(MAGIC)
        self._file.write(json.dumps(asdict(header), sort_keys=True).encode() + b"\n")

    def write(self, copy_data: bytes) -> None:
        self._file.write(_LEN.pack(len(copy_data)))
        self._file.write(copy_data)

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


def read_capture(path: str | Path) -> tuple[CaptureHeader, Iterator[XLogData | PrimaryKeepalive]]:
    """The header, and an iterator over the recorded messages."""
    f = open(path, "rb")  # noqa: SIM115  (closed by the iterator)
    if f.read(len(MAGIC)) != MAGIC:
        f.close()
        raise CaptureFormatError(f"{path} is not a pgdecode capture (no {MAGIC!r} header)")
    try:
        raw: dict[str, Any] = json.loads(f.readline())
        header = CaptureHeader(**raw)
    except (ValueError, TypeError) as exc:
        f.close()
        raise CaptureFormatError(f"{path}: bad capture header: {exc}") from None

    def frames() -> Iterator[XLogData | PrimaryKeepalive]:
        with f:
            offset = f.tell()
            while head := f.read(_LEN.size):
                if len(head) < _LEN.size:
                    raise CaptureFormatError(f"{path}: truncated frame header at byte {offset}")
                (length,) = _LEN.unpack(head)
                payload = f.read(length)
                if len(payload) < length:
                    raise CaptureFormatError(f"{path}: truncated frame at byte {offset}")
                yield decode_copy_data(payload)
                offset += _LEN.size + length

    return header, frames()


def described_relations(path: str | Path) -> Iterator[RelationMessage]:
    """The Relation messages of a capture, decoded (nothing else is): what a replay will learn
    of its tables, to check options against before replaying."""
    header, frames = read_capture(path)
    decoder = Decoder(header.proto_version)
    for frame in frames:
        if not isinstance(frame, XLogData) or not frame.data:
            continue
        tag = frame.data[0]
        if tag == 0x53 and header.proto_version >= 2:  # Stream Start: xids precede relations
            decoder.in_stream = True
        elif tag == 0x45 and header.proto_version >= 2:  # Stream Stop
            decoder.in_stream = False
        elif tag == 0x52:  # Relation
            message = decoder.decode(frame.data)
            assert isinstance(message, RelationMessage)
            yield message
