"""The row-filter layer's compiled speedup (optional: built by ``pip install`` where there is
a C compiler): ``_rawfilter`` decides a relation's row filters on raw pgoutput row changes,
mirroring ``PublicationFilters.filter_change``, the reference (see rowfilter/raw.py). This
package imports nothing, so that the modules it speeds up can import it."""
