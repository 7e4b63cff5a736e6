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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from plugin_framework.protocol import (
    MAX_PROTO_VERSION,
    MIN_PROTO_VERSION,
    Decoder,
    PrimaryKeepalive,
    ProtocolError,
    RelationMessage,
    XLogData,
    decode_copy_data,
)

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


def _read_header(f: IO[bytes], path: str | Path) -> CaptureHeader:
    if f.read(len(MAGIC)) != MAGIC:
        raise CaptureFormatError(f"{path} is not a pgdecode capture (no {MAGIC!r} header)")
    try:
        return parse_header(json.loads(f.readline()))
    except (ValueError, TypeError) as exc:  # CaptureFormatError, JSON or UTF-8 errors
        raise CaptureFormatError(f"{path}: bad capture header: {exc}") from None


def read_header(path: str | Path) -> CaptureHeader:
    """The header of a capture, checked (CaptureFormatError): before anything is replayed."""
    with open(path, "rb") as f:
        return _read_header(f, path)


def read_capture(path: str | Path) -> tuple[CaptureHeader, Iterator[XLogData | PrimaryKeepalive]]:
    """The header, and an iterator over the recorded messages."""
    f = open(path, "rb")  # noqa: SIM115  (closed by the iterator)
    try:
        header = _read_header(f, path)
    except BaseException:
        f.close()
        raise

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
                try:
                    message = decode_copy_data(payload)
                except ProtocolError as exc:
                    raise CaptureFormatError(
                        f"{path}: damaged frame at byte {offset}: {exc}") from None
                yield message
                offset += _LEN.size + length

    return header, frames()


def described_relations(path: str | Path) -> Iterator[RelationMessage]:
    """The Relation messages of a capture, decoded (nothing else is): what a replay will learn
    of its tables, to check options against before replaying. A bad header is refused at
    once; a truncated or damaged frame when the iteration reaches it."""
    header, frames = read_capture(path)
    return _relations(header.proto_version, frames)


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
