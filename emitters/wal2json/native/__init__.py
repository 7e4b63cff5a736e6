"""The wal2json emitter's C formatter (optional: built by ``pip install`` where there is a
C compiler): ``_wal2jsonrow`` formats a row change as ``emitters/wal2json``'s change callback
does, which stays the reference (tests/emitters/test_wal2json_native.py)."""
