"""The json emitter's C formatter (optional: built by ``pip install`` where there is a C
compiler): ``_jsonrow`` formats a row change as ``emitters/json``'s change callback does,
which stays the reference (tests/emitters/test_json_native.py)."""
