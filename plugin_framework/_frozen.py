"""Building frozen dataclasses on hot paths without their generated ``__init__``.

A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__``, which
costs about as much as parsing a short row. The decoder's messages, the reorder buffer's
``Change`` and a context's ``OutputRecord`` are made once per change, so their hot paths
create the object with ``object.__new__`` and set each slot through its descriptor: the same
object in a third of the time.

That is only the same object if every field is set and nothing else would have run.
``frozen_setters`` checks both when the module is imported: it refuses a class with
``__post_init__`` and insists on being given every field, in order, so a field added to the
class later fails loudly instead of being left unset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

new_object = object.__new__


def frozen_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The ``__slots__`` setters of a slotted frozen dataclass's fields ``names``: all of
    them, in declaration order."""
    fields = tuple(f.name for f in dataclasses.fields(cls))
    if names != fields:
        raise TypeError(f"{cls.__name__}: fields {names} given, the class has {fields}")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__, which setting slots would skip")
    return tuple(cls.__dict__[name].__set__ for name in names)
