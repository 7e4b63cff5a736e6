"""The change builder's compiled speedup (optional: built by ``pip install`` where there is a C
compiler): ``_changerows`` appends a raw row change to a ``ChangeBuilder`` as
``builder.py``'s ``add_change`` appends the decoded change, which stays the reference. This
package imports nothing, so that the modules it speeds up can import it."""
