"""The framework layer's compiled speedup (optional: built by ``pip install`` where there is a
C compiler): ``_text.is_utf8`` checks a line, and ``_text.first_invalid_utf8`` finds the
first of a run of lines that is not UTF-8, as ``LogicalDecodingContext._check_textual``
decides it by decoding (the reference).
This package imports nothing, so that the modules it speeds up can import it."""
