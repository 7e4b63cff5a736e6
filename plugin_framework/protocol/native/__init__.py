"""The protocol layer's compiled speedups (optional: built by ``pip install`` where there is a
C compiler). Each mirrors Python code that stays the reference: ``_tuples`` reads TupleData
as ``protocol/tuples.py`` does. This package imports nothing, so that the modules it speeds
up can import it. Its C headers, ``_pgrow.h`` (raw row changes read in C, an output buffer)
and ``pgoutput_tags.h`` (generated), serve every C module that reads raw messages."""
