"""Emitters installed as entry points in the ``pgdecode.emitters`` group.

An entry point names an OutputPlugin subclass (instantiated with no arguments) or any object
with ``@hookimpl`` callbacks (a module, a class, an instance). Loading can be limited to an
allowlist, so that installing a package never silently adds code to a pipeline.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from plugin_framework.framework.plugin import LoadedPlugin, OutputPlugin

GROUP = "pgdecode.emitters"
ALLOWLIST_ENV = "PGDECODE_EMITTER_ALLOWLIST"


class EmitterNotFound(LookupError):
    pass


@dataclass(frozen=True)
class EmitterInfo:
    """An installed emitter: its entry point and the distribution that provides it."""

    name: str
    value: str  # module:attribute
    distribution: str
    version: str


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def _allowlist(allow: Collection[str] | None) -> Collection[str] | None:
    if allow is not None:
        return allow
    env = os.environ.get(ALLOWLIST_ENV)
    return [n.strip() for n in env.split(",") if n.strip()] if env else None


def installed_emitters(allow: Collection[str] | None = None) -> list[EmitterInfo]:
    allowed = _allowlist(allow)
    infos = []
    for name, ep in sorted(_entry_points().items()):
        if allowed is not None and name not in allowed:
            continue
        dist = ep.dist
        infos.append(EmitterInfo(name, ep.value, dist.name if dist else "?",
                                 dist.version if dist else "?"))
    return infos


def load_emitter(name: str, allow: Collection[str] | None = None) -> LoadedPlugin:
    """Load and validate the emitter registered under ``name``."""
    allowed = _allowlist(allow)
    if allowed is not None and name not in allowed:
        raise EmitterNotFound(
            f'emitter "{name}" is not in the allowlist ({", ".join(sorted(allowed)) or "empty"}); '
            f"add it to {ALLOWLIST_ENV} or --emitter-allowlist"
        )
    points = _entry_points()
    ep = points.get(name)
    if ep is None:
        known = ", ".join(sorted(points)) or "none"
        raise EmitterNotFound(
            f'no emitter named "{name}" is installed (installed: {known}); emitters are '
            f'entry points in the "{GROUP}" group'
        )
    try:
        target = ep.load()
        is_class = isinstance(target, type) and issubclass(target, OutputPlugin)
        plugin = target() if is_class else target
    except Exception as exc:
        dist = f" (from {ep.dist.name} {ep.dist.version})" if ep.dist else ""
        raise EmitterNotFound(
            f'emitter "{name}"{dist} is installed but cannot be loaded from {ep.value}: '
            f"{type(exc).__name__}: {exc}; reinstall it, or check that its dependencies are "
            "installed"
        ) from exc
    return LoadedPlugin(plugin, name)
