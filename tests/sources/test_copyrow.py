"""The initial snapshot's C conversion of a COPY text row into an Insert message
(``_copyrow.insert_message``; ``read_messages`` uses the same code) against the text format
as PostgreSQL reads it (CopyReadAttributesText), written out here in Python, on any bytes:
escapes of every kind, a backslash that ends a field, \\N, tabs, too few or too many fields.

tests/sources/test_snapshot.py holds the C reader equal to psycopg's parser on what real servers
copy out; this reaches the escapes a server never writes (octal, hex), which COPY's format
has all the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugin_framework.protocol import Insert, TupleData, encode
from plugin_framework.sources.libpq import mapped_libpq

_copyrow = pytest.importorskip("plugin_framework.sources.native._copyrow",
                               reason="built without a C compiler")

_SIMPLE = {ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("v"): 11}
_OCTAL, _HEX = b"01234567", b"0123456789abcdefABCDEF"


def unescape(field: bytes) -> bytes:
    """One field's value (CopyReadAttributesText): a backslash escapes what follows."""
    out = bytearray()
    i = 0
    while i < len(field):
        c = field[i]
        if c != ord("\\") or i + 1 >= len(field):
            out.append(c)
            i += 1
            continue
        c = field[i + 1]
        i += 2
        if c in _SIMPLE:
            out.append(_SIMPLE[c])
        elif c == ord("x") and i < len(field) and field[i] in _HEX:
            digits = field[i:i + 2] if field[i + 1:i + 2] and field[i + 1] in _HEX else \
                field[i:i + 1]
            out.append(int(digits, 16))
            i += len(digits)
        elif c in _OCTAL:
            digits = bytes([c])
            while len(digits) < 3 and i < len(field) and field[i] in _OCTAL:
                digits += field[i:i + 1]
                i += 1
            out.append(int(digits, 8) & 0xFF)
        else:
            out.append(c)  # \x without a hex digit is x; any other character is itself
    return bytes(out)


def reference(row: bytes, ncols: int) -> bytes | None:
    """The Insert message of relation 1 for ``row``, or None when it has not ncols fields."""
    fields = row.removesuffix(b"\n").split(b"\t")
    if len(fields) != ncols:
        return None
    values = tuple(None if f == b"\\N" else unescape(f) for f in fields)
    kinds = bytes(ord("n") if v is None else ord("t") for v in values)
    return encode(Insert(1, TupleData(kinds, values)))


# Fields that hit every branch: escapes (valid, cut off by the field's end or by a tab),
# octal runs of one to four digits, hex of zero to three digits, \N alone and within text
_PIECES = [b"\\", b"\\\\", b"\\N", b"N", b"\\b", b"\\f", b"\\n", b"\\r", b"\\t", b"\\v", b"\\q",
           b"\\x", b"\\xg", b"\\x4", b"\\x41", b"\\x41f", b"\\7", b"\\77", b"\\101", b"\\1012",
           b"\\8", b"\\477", b"a", b"\xc3\xa9", b"\xff", b"\t", b"\n", b"\r", b" "]
rows = st.lists(st.one_of(st.sampled_from(_PIECES), st.binary(max_size=6)),
                max_size=14).map(b"".join)


@given(rows, st.integers(1, 6))
def test_insert_message_reads_the_text_format(row: bytes, ncols: int) -> None:
    head = b"I" + (1).to_bytes(4, "big") + b"N" + ncols.to_bytes(2, "big")
    expected = reference(row, ncols)
    if expected is None:
        with pytest.raises(ValueError, match=f"for a table of {ncols} columns"):
            _copyrow.insert_message(head, ncols, row)
    else:
        assert _copyrow.insert_message(head, ncols, row) == expected


def test_the_reference_reads_what_copy_writes() -> None:
    """The reference is PostgreSQL's format, not the C code's: examples from COPY's docs."""
    assert reference(b"1\t\\N\ta\\tb\\\\c\\nd\n", 3) == encode(
        Insert(1, TupleData(b"tnt", (b"1", None, b"a\tb\\c\nd"))))
    assert unescape(b"\\101\\x41\\x4a\\0") == b"AAJ\x00"


def test_read_messages_refuses_without_libpq_or_bad_arguments() -> None:
    """The C reader is called only bound to psycopg's libpq (sources/libpq.py); its guards
    answer with an error, not a crash."""
    with pytest.raises(ValueError, match=r"bad connection or count|not bound"):
        _copyrow.read_messages(b"I", 1, 0, 10)
    with pytest.raises(ValueError, match="address is 0"):
        _copyrow.bind_libpq(0, 1, 1, 1)


def test_the_one_mapped_libpq_is_found_and_two_are_not(tmp_path: Path) -> None:
    """sources/libpq.py binds the C reader only to the one libpq mapped into the process."""
    def maps(*paths: str) -> str:
        lines = [f"7f00-7f01 r-xp 00000000 08:01 {n} {p}\n" for n, p in enumerate(paths)]
        lines.append("7f02-7f03 rw-p 00000000 00:00 0 \n")  # anonymous: no path
        path = tmp_path / "maps"
        path.write_text("".join(lines))
        return str(path)

    bundled = "/venv/site-packages/psycopg_binary.libs/libpq-e9b5c9ac.so.5.18"
    system = "/usr/lib/x86_64-linux-gnu/libpq.so.5.15"
    walreceiver = "/usr/lib/postgresql/15/lib/libpqwalreceiver.so"
    assert mapped_libpq(maps(bundled, bundled, walreceiver)) == bundled
    assert mapped_libpq(maps(system)) == system
    assert mapped_libpq(maps(bundled, system)) is None
    assert mapped_libpq(maps(walreceiver)) is None
    assert mapped_libpq(str(tmp_path / "missing")) is None
