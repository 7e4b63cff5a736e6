"""The capture format: a replication stream recorded to a file, to replay without a server.

Layout of version 2, what is written (all integers big-endian):

    PGDECODE-CAPTURE 2\n
    <one line of JSON: proto_version, options, server_version, slot, created>\n
    uint32 CRC-32 of that line (its newline included)
    then, repeated: uint32 length, uint32 CRC-32 of the length's 4 bytes and the payload,
    and that many bytes of one CopyData payload exactly as the server sent it ('w' XLogData
    or 'k' keepalive).

A CRC-32 catches every single-bit flip and every burst up to 32 bits: a damaged header or
frame is refused, naming the frame and its offset, instead of replaying a different stream.
Version 1 (``PGDECODE-CAPTURE 1``) is the same without the CRCs; it is still read, and its
damage can go unnoticed.
"""

from __future__ import annotations

import json
import struct
import zlib
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

MAGIC_V1 = b"PGDECODE-CAPTURE 1\n"  # no checksums: read, never written
MAGIC = MAGIC_V2 = b"PGDECODE-CAPTURE 2\n"
_LEN = struct.Struct(">I")
_LEN_CRC = struct.Struct(">II")
_crc32 = zlib.crc32


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
        line = json.dumps(asdict(header), sort_keys=True).encode() + b"\n"
        self._file.write(MAGIC + line + _LEN.pack(_crc32(line)))

    def write(self, copy_data: bytes) -> None:
        length = _LEN.pack(len(copy_data))
        self._file.write(_LEN_CRC.pack(len(copy_data), _crc32(copy_data, _crc32(length))))
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


def _read_header(f: IO[bytes], path: str | Path) -> tuple[CaptureHeader, int]:
    """The header, and the capture's format version."""
    magic = f.read(len(MAGIC))
    if magic == MAGIC_V2:
        version = 2
    elif magic == MAGIC_V1:
        version = 1
    elif magic[:-2] == MAGIC[:-2] and magic[-2:-1].isdigit() and magic[-1:] == b"\n":
        raise CaptureFormatError(
            f"{path} is a pgdecode capture of format version {magic[-2:-1].decode()}, which "
            "this pgdecode does not read (it reads versions 1 and 2): use a newer pgdecode")
    else:
        raise CaptureFormatError(f"{path} is not a pgdecode capture (no {MAGIC!r} header)")
    line = f.readline()
    if version >= 2:
        stored = f.read(_LEN.size)
        if len(stored) < _LEN.size or _LEN.unpack(stored)[0] != _crc32(line):
            raise CaptureFormatError(
                f"{path}: bad capture header: its checksum does not match (the file was "
                "damaged or changed after it was written)")
    try:
        return parse_header(json.loads(line)), version
    except (ValueError, TypeError) as exc:  # CaptureFormatError, JSON or UTF-8 errors
        raise CaptureFormatError(f"{path}: bad capture header: {exc}") from None


def read_header(path: str | Path) -> CaptureHeader:
    """The header of a capture, checked (CaptureFormatError): before anything is replayed."""
    with open(path, "rb") as f:
        return _read_header(f, path)[0]


def read_capture(path: str | Path) -> tuple[CaptureHeader, Iterator[XLogData | PrimaryKeepalive]]:
    """The header, and an iterator over the recorded messages."""
    f = open(path, "rb")  # noqa: SIM115  (closed by the iterator)
    try:
        header, version = _read_header(f, path)
    except BaseException:
        f.close()
        raise
    head_size = _LEN_CRC.size if version >= 2 else _LEN.size

    def frames() -> Iterator[XLogData | PrimaryKeepalive]:
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
                if version >= 2 and _LEN.unpack_from(head, 4)[0] != _crc32(
                        payload, _crc32(head[:4])):
                    raise CaptureFormatError(
                        f"{path}: damaged {where}: its checksum does not match (the file was "
                        "damaged or changed after it was written)")
                try:
                    message = decode_copy_data(payload)
                except ProtocolError as exc:
                    raise CaptureFormatError(f"{path}: damaged {where}: {exc}") from None
                yield message
                offset += head_size + length
                number += 1

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
