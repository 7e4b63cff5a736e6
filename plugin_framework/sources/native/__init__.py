"""The initial copy's C reader (optional: built by ``pip install`` where there is a C
compiler): ``_copyrow`` reads COPY's rows from libpq and makes each an Insert message, as
psycopg's COPY parser and the protocol encoder do, which stay the reference
(tests/sources/test_copyrow.py, test_snapshot.py). This package imports nothing."""
