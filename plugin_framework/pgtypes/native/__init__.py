"""The pgtypes layer's C header (no module): ``_jsonvalue.h``, the C mirror of the text
converters that ``converters.NATIVE_KIND`` marks, writing each value as JSON straight from its
text in a pgoutput tuple. The json emitter's C formatter (``emitters/json/native/_jsonrow.c``)
and the Spark change builder's (``plugin_framework/spark/changes/native/_changerows.c``)
include it, so that a type's JSON has one definition in C as it has one converter in
Python."""
