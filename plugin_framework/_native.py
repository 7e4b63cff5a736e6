"""pgdecode's C modules, loaded in one place.

Each C module speeds up Python code that stays its reference, and the tests prove the two
equal (as psycopg's C implementation mirrors its Python one). Where a module is not built
(no C compiler at install), the Python code runs. ``PGDECODE_IMPL`` chooses, as psycopg's
``PSYCOPG_IMPL`` does: ``python`` runs the Python code only; ``c`` requires every C module
(the import fails, naming the one missing); unset or empty, each C module that is built.
``pgdecode --version`` says which are in use.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

VARIABLE = "PGDECODE_IMPL"
_CHOICES = ("", "python", "c")

_status: dict[str, str] = {}  # module -> "c", or why its Python reference runs instead


def impl() -> str:
    """The implementation asked for: "python", "c", or "" (each C module that is built)."""
    value = os.environ.get(VARIABLE, "").strip().lower()
    if value not in _CHOICES:
        raise ImportError(f"{VARIABLE}={value!r} is not an implementation: set it to python "
                          "or c, or leave it unset")
    return value


def load_native(name: str) -> ModuleType | None:
    """The C module ``name`` (a dotted module name), or None where its Python reference is
    to run instead."""
    choice = impl()
    if choice == "python":
        _status[name] = f"python ({VARIABLE}=python)"
        return None
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if choice == "c":
            raise ImportError(
                f"{VARIABLE}=c, but the C module {name} is not built ({exc}): install pgdecode "
                f"where a C compiler is available, or unset {VARIABLE}") from exc
        _status[name] = "python (not built)"
        return None
    _status[name] = "c"
    return module


def native_status() -> dict[str, str]:
    """Each C module asked for so far: "c" where it runs, else why its Python reference
    runs instead."""
    return dict(sorted(_status.items()))
