"""Snapshots: the rows of published tables copied into the stream, consistently with it.

- ``catalog``: what a snapshot reads of the catalog (published tables, keys, estimates) and
  the statements that read a table by key; every caller (sources, Spark, the command) asks
  it;
- ``copy``: the initial copy's parallel COPY through an exported snapshot;
- ``ledger``: how far an initial copy is, as the outputs record it;
- ``initial``: the initial copy as the walsender source drives it (taken, gone on with after
  an interruption, said unfinished);
- ``incremental``: tables copied chunk by chunk into a running stream (watermarks);
- ``toasted``: rows moved to another key with a TOAST value left out, read again.
"""
