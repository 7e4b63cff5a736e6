"""The columns of the tables a batch holds: PostgreSQL types as Spark types and names as
Spark SQL identifiers (``types.py``), the same conversions into Arrow in Python
(``arrowtyped.py``), what a batch says about each table and a description changing under a
mirror (``descriptions.py``), and the per-table DataFrames with real types
(``tables.py``: ``split_tables``) and in Spark's change-feed shape (``changefeed.py``)."""
