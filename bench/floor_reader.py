"""The callback path's floor for bench/stream.py: what `pgdecode stream` costs with a plugin
that does nothing.

    python bench/floor_reader.py CONNINFO SLOT PUBLICATION ENDPOS PROTO STREAMING FILE

The same `WalsenderSource`, `Pipeline` and `FileOutput` that `pgdecode stream` builds, with
bench/emit.py's `EmptyPlugin` (begin, change and commit do nothing) in place of an emitter:
the replication loop, pgoutput decoding and the reorder buffer, and no formatting. No emitter
that formats in its change callback makes `pgdecode stream` faster than this; the json
emitter's C fast path (its ``fast_change`` callback) skips decoding and the callback, and is
faster.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from emit import EmptyPlugin  # bench/ is not a package

from plugin_framework.framework import FileOutput, Pipeline
from plugin_framework.protocol import LSN
from plugin_framework.sources.session import SourceConfig
from plugin_framework.sources.walsender import WalsenderSource


def main(argv: Sequence[str]) -> int:
    conninfo, slot, publication, endpos, proto, streaming, out = argv
    pipeline = Pipeline(slot_name=slot)
    pipeline.add(EmptyPlugin(), output=FileOutput(out))
    config = SourceConfig(conninfo=conninfo, slot=slot, publications=[publication],
                          proto_version=int(proto), streaming=streaming, endpos=LSN(endpos))
    try:
        WalsenderSource(config, pipeline).run()
    finally:
        pipeline.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
