"""The mirrors: ready-made foreachBatch functions, idempotent by batch id.

``TableSink`` (``template.py``) runs the steps the state mirrors share for each table of a
batch; the mirrors implement how they read what their target holds and how they commit:
``TableStateWriter`` (``parquet.py``, its files in ``statefiles.py``), ``DeltaTableWriter``
(``delta.py``, Delta tables through ``deltatables.py``), ``HistoryWriter`` (``history.py``,
with the versions of ``versions.py``) and ``MergeIntoWriter`` (``mergeinto.py``, its
statements in ``mergesql.py``). The shared steps: the net changes (``netchange.py``), typed
(``typed.py``), unchanged TOAST values filled in (``toast.py``), the state's rows
(``staterows.py``), keys (``keys.py``). ``ChangeLogWriter`` (``changelog.py``) appends every
change instead; every mirror refuses another query's batches (``queries.py``)."""
