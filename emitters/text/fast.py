"""The glue to the text emitter's C fast path, emitters/text/native/_textrow.c.

A relation's formatter is made from what ``RelationText`` computed for it (the line heads,
each column's print_literal style and headers), so the C code and the Python callback print
from one description. tests/emitters/test_text_native.py holds the two equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from emitters.text.relation import BARE, BIT, BOOL, QUOTED

if TYPE_CHECKING:
    from emitters.text.relation import RelationText

from plugin_framework import load_native

if TYPE_CHECKING:
    from emitters.text.native import _textrow
else:
    _textrow = load_native("emitters.text.native._textrow")

__all__ = ["FAST_PATH_BUILT", "row_format"]

FAST_PATH_BUILT: Final = _textrow is not None
"""Whether the C module is built (``pip install`` compiles it where there is a compiler)."""

# relation.py's style numbers -> the C module's (an unknown style fails here, at import)
_STYLES: Final[dict[int, int]] = (
    {} if _textrow is None else {QUOTED: _textrow.QUOTED, BARE: _textrow.BARE,
                                 BOOL: _textrow.BOOL, BIT: _textrow.BIT})


def row_format(text: RelationText, gated: bool
               ) -> _textrow.RowFormat | None:
    """The C formatter of a relation's row-change lines (called as its ``line(data, lsn,
    txn)``; ``lines`` formats a run of messages in one call), or None without the C module.
    ``gated``: skip-empty-xacts, where a transaction's first change goes through the
    callback, which prints the BEGIN first."""
    if _textrow is None:
        return None
    columns = text.tuple_columns
    return _textrow.RowFormat(
        text.relation.relation_id, (text.insert, text.update, text.delete),
        bytes(_STYLES[style] for style, _, _ in columns),
        tuple(head for _, head, _ in columns), tuple(bare for _, _, bare in columns),
        gated)
