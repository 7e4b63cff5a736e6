"""The text emitter's C formatter (optional: built by ``pip install`` where there is a C
compiler): ``_textrow`` formats a row change as ``emitters/text``'s change callback does,
which stays the reference (tests/emitters/test_text_native.py)."""
