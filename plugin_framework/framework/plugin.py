"""Output plugins: the ``OutputPlugin`` base class, and loading with PostgreSQL's rules.

A plugin is either an ``OutputPlugin`` subclass instance (its overridden methods are its
callbacks) or any object carrying ``@hookimpl`` functions. Either way it is registered in a
pluggy plugin manager of its own, validated, and resolved to plain callables for the hot path.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import pluggy

import plugin_framework.framework.hookspecs as hookspecs
from plugin_framework.framework.callbacks import (
    CALLBACK_ARGS,
    CALLBACKS,
    REQUIRED,
    STREAM_CALLBACKS,
    STREAM_REQUIRED,
    TWO_PHASE_CALLBACKS,
    TWO_PHASE_REQUIRED,
    c_name,
)


class OutputPlugin:
    """Base class for output plugins written as classes.

    Override the callbacks you implement, named as PostgreSQL's without ``_cb``: ``begin``,
    ``change`` and ``commit`` are required; see ``plugin_framework.framework.hookspecs`` for
    every callback and its arguments. Methods you do not override are not registered, exactly
    as a NULL member of OutputPluginCallbacks.
    """

    #: The name used in error messages and ``pgdecode emitters``; defaults to the class name.
    name: str | None = None

    def stream_metrics(self) -> Iterable[PluginMetric]:
        """Optional, pgdecode's own: the plugin's figures among the stream's Prometheus
        metrics (``--metrics-port``), read each time they are scraped (from another thread:
        read, do not change). None by default."""
        return ()


class PluginMetric(NamedTuple):
    """One sample of a plugin's metric: ``pgdecode_<name>``, of ``kind`` "counter" or
    "gauge", with ``labels`` beside the stream's ``slot``."""

    name: str
    help: str
    kind: str
    labels: tuple[tuple[str, str], ...]
    value: float


class PluginLoadError(Exception):
    """A plugin does not satisfy PostgreSQL's output-plugin rules."""


class _PluginManager(pluggy.PluginManager):
    """Also sees the overridden callback methods of OutputPlugin instances as hook impls."""

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if (opts is None and isinstance(plugin, OutputPlugin) and name in CALLBACKS
                and getattr(type(plugin), name, None) is not None):
            return {}
        return opts


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name.removesuffix("_cb"), CALLBACKS, n=1, cutoff=0.75)
    return f' (did you mean "{close[0]}"?)' if close else ""


def _check_spelling(plugin: object, label: str) -> None:
    """Reject methods of an OutputPlugin subclass that look like misspelled callbacks."""
    if not isinstance(plugin, OutputPlugin):
        return
    for klass in type(plugin).__mro__:
        if klass in (OutputPlugin, object):
            continue
        for attr, value in vars(klass).items():
            if attr in CALLBACKS or attr.startswith("_") or not callable(value):
                continue
            if attr.endswith("_cb") or _suggest(attr):
                raise PluginLoadError(
                    f'output plugin "{label}": method "{attr}" is not an output plugin '
                    f"callback{_suggest(attr)}"
                )


class LoadedPlugin:
    """A validated plugin: its callables and its capabilities. What a C plugin's
    _PG_output_plugin_init fills in (its OutputPluginCallbacks), checked as logical.c checks
    it."""

    def __init__(self, plugin: object, name: str | None = None) -> None:
        label = name or getattr(plugin, "name", None) or _default_name(plugin)
        self.name: str = label
        self.plugin = plugin
        _check_spelling(plugin, label)
        pm = _PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        try:
            pm.register(plugin, name=label)
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginLoadError(f'output plugin "{label}": {exc}') from None
        self.callbacks: dict[str, Callable[..., Any]] = {}
        for cb in CALLBACKS:
            impls = getattr(pm.hook, cb).get_hookimpls()
            if impls:
                self.callbacks[cb] = _positional(cb, impls[0].function, impls[0].argnames)
        self._validate()
        implemented = set(self.callbacks)
        self.streaming = bool(implemented & STREAM_CALLBACKS)
        self.two_phase = bool(implemented & TWO_PHASE_CALLBACKS)

    def _validate(self) -> None:
        have = set(self.callbacks)
        for cb in REQUIRED:
            if cb not in have:
                raise PluginLoadError(
                    f'output plugin "{self.name}": output plugins have to register a {cb} callback'
                )
        if have & STREAM_CALLBACKS:
            for cb in STREAM_REQUIRED:
                if cb not in have:
                    raise PluginLoadError(
                        f'output plugin "{self.name}": logical streaming requires a '
                        f"{c_name(cb)} callback"
                    )
        if have & TWO_PHASE_CALLBACKS:
            for cb in TWO_PHASE_REQUIRED:
                if cb not in have:
                    raise PluginLoadError(
                        f'output plugin "{self.name}": logical replication at prepare time '
                        f"requires a {c_name(cb)} callback"
                    )
        if have & STREAM_CALLBACKS and have & TWO_PHASE_CALLBACKS and "stream_prepare" not in have:
            raise PluginLoadError(
                f'output plugin "{self.name}": logical streaming at prepare time requires a '
                "stream_prepare_cb callback"
            )

    def has(self, callback: str) -> bool:
        return callback in self.callbacks

    def __repr__(self) -> str:
        return f"LoadedPlugin({self.name!r}, callbacks={sorted(self.callbacks)})"


def _default_name(plugin: object) -> str:
    if isinstance(plugin, type):
        return plugin.__name__
    module_name = getattr(plugin, "__name__", None)
    if isinstance(module_name, str):
        return module_name
    return type(plugin).__name__


def _positional(cb: str, fn: Callable[..., Any], argnames: tuple[str, ...]) -> Callable[..., Any]:
    """A callable taking the callback's full positional arguments, whatever subset ``fn``
    accepts (pluggy lets an implementation take fewer arguments than the spec)."""
    spec = CALLBACK_ARGS[cb]
    if tuple(argnames) == spec:
        return fn
    wanted = [(i, n) for i, n in enumerate(spec) if n in argnames]

    def call(*args: Any) -> Any:
        return fn(**{n: args[i] for i, n in wanted})

    return call
