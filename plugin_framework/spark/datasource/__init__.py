"""The Structured Streaming way in, ``format("pgoutput")``: the PySpark data source and its
readers (``reader.py``), their reads of the slot through the SQL interface (``peek.py``),
their options (``options.py``), the initial snapshot carried in the offsets
(``snapshot.py``) and Prometheus metrics (``metrics.py``). Importing ``reader.py`` imports
``pyspark.sql.datasource``: ``plugin_framework.spark`` gives ``PgoutputDataSource`` lazily."""
