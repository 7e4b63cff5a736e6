"""The ``json`` emitter: pgdecode's native change format, one JSON object per line.

    {"op":"insert","schema":"public","table":"items","lsn":"0/1A2B3C8","xid":741,
     "commit_lsn":"0/1A2B4F0","commit_time":"2024-05-01T12:00:00.123456+00:00","origin":null,
     "key":["id"],"new":{"id":1,"name":"one","price":"1.50"}}

The format, its options and the type mapping are documented in docs/json-format.md and
specified by docs/json-change.schema.json.

- ``options``: the OPTIONS table.
- ``relation``: the per-relation plan (names, converters, the bytes of the line's fixed
  parts) and the row objects.
- ``emitter``: JsonEmitter, its callbacks and its per-context state.
- ``fast``: the glue to the C fast path, emitters/json/native/_jsonrow.c.

Speed: a line is assembled from byte strings computed once per relation (its op, schema and
table prefix, its key list) and once per transaction (xid, commit LSN and time, origin, gid);
only the row objects go through orjson. Each column has a converter chosen once per relation
from its type (plugin_framework.pgtypes.TypeConverters): for the common types the server's
text is already the JSON value (integers, finite floats, json, jsonb) and is embedded
verbatim as an ``orjson.Fragment``, so nothing is parsed. Binary-format values (pgoutput's
``binary`` option) are decoded to the text the server would have sent, then converted by the
same rules, so that the JSON is the same whichever format the server used.

The fast path: where the C module ``emitters.json.native._jsonrow`` is built (it is, by ``pip
install`` with a C compiler), each relation's plan also gets a ``RowFormat`` that writes the line of
an Insert, Update or Delete straight from the pgoutput message, which the pipeline then uses instead
of decoding the message and calling ``change`` (the ``fast_change`` callback). It takes the
common forms of the common types' text, for the converters that declare a native code
(``pgtypes.NATIVE_KIND``); it hands any other value to the column's Python converter, and
anything else (binary-format columns, malformed data) back to ``change``, so the lines are
the same either way: tests/emitters/test_json_native.py holds the two to that.
"""

from __future__ import annotations

from emitters.json.emitter import JsonEmitter
from emitters.json.options import OPTIONS

__all__ = ["OPTIONS", "JsonEmitter"]
