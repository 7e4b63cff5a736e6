"""The change rows of both ways in: the change schema (``schema.py``), the columnar builder
that makes them from decoded changes (``builder.py``, with each Relation's plan in
``plans.py``; ``native/_changerows.c`` appends raw row changes to it in C, ``changerows.py``
the glue), and a batch's rows by table as the mirrors read them (``rows.py``)."""
