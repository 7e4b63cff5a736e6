"""The foreachBatch way in: ``ForeachBatchPlugin`` (``plugin.py``), an output plugin whose
callbacks collect committed transactions, and its batching half (``batching.py``): when a
batch goes out, its delivery to ``fn(batch_df, batch_id)`` and the sinks, how far the slot
may then be acknowledged, which its Output reports (``output.py``); the batch log that
makes delivery exactly-once (``checkpoint.py``); the batch's DataFrame, made in the JVM only
when read (``lazyframe.py``); and ``ForeachBatchStream``, the Python API (``stream.py``)."""
