"""pgdecode's built-in emitters, each an output plugin of the framework.

- ``text`` (emitters/text/): contrib/test_decoding's output, byte for byte;
- ``wal2json`` (emitters/wal2json/): wal2json 2.5's, byte for byte;
- ``json``: pgdecode's native change format, a JSON object per line;
- ``spark`` (emitters/spark.py): committed transactions in micro-batches to a foreachBatch
  function, over plugin_framework.spark.

Shared by them: ``options`` (one option-table parser) and ``pgformat`` (PostgreSQL's own text
forms of timestamps and literals). Emitters use only the public API of plugin_framework, as a
third-party plugin would; the entry points of the ``pgdecode.emitters`` group name them.
"""
