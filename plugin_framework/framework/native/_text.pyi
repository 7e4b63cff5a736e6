# The C module plugin_framework/framework/native/_text.c: the textual-output check of a run of
# lines.

def first_invalid_utf8(lines: list[bytes], /) -> int: ...
