"""The layering of the code, checked on the source (no server, no imports run): imports point
one way, from the layers above to the layers below; no import cycle between modules or
between packages; emitters and contrib use only the public API; no module over 600 lines
(400 in spark/). Inside spark/, the wings are layers too, and the ways in and the mirrors,
side by side, do not import one another.

Every import counts, also those inside functions and under TYPE_CHECKING: a lazy import
hides a dependency, it does not remove it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_PACKAGES = ("plugin_framework", "emitters", "contrib")

# The layers of plugin_framework, lowest first: a module may import from its own layer and
# the layers below it, never from a layer above. A prefix names a package (and everything
# in it) or a module; the longest prefix that matches decides. "plugin_framework" alone is
# the package's __init__ (its public API: the framework and protocol names it re-exports).
# pgtypes does not exist yet everywhere: it is accepted once it appears.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("plugin_framework._frozen", "plugin_framework._native")),
    ("protocol", ("plugin_framework.protocol",)),
    ("pgtypes", ("plugin_framework.pgtypes",)),
    ("framework", ("plugin_framework.framework", "plugin_framework")),
    ("rowfilter", ("plugin_framework.rowfilter",)),
    ("sources", ("plugin_framework.sources",)),
    # Snapshots use the sources' connections, errors and sessions; the walsender source, the
    # one that drives them, is above them (a unit of its own in the package graph).
    ("snapshots", ("plugin_framework.sources.snapshots",)),
    ("walsender", ("plugin_framework.sources.walsender",)),
    # The assembly of pipelines (app), the demo built on it, and the throwaway cluster the
    # demo and the tests start: above every source, below what runs a pipeline (Spark's
    # foreachBatch stream assembles its pipeline with app too).
    ("app", ("plugin_framework.app", "plugin_framework.demo", "plugin_framework.cluster")),
    # Spark, in wings (docs/architecture.md): the change rows (with settings, the one session
    # helper that both the foreachBatch way in and the mirrors use), then the columns of the
    # tables they hold, then the two ways in and the mirrors, side by side (APART); the
    # package's __init__, its public names, above them all.
    ("spark.changes", ("plugin_framework.spark.changes", "plugin_framework.spark.settings")),
    ("spark.columns", ("plugin_framework.spark.columns",)),
    ("spark wings", ("plugin_framework.spark.foreachbatch", "plugin_framework.spark.datasource",
                     "plugin_framework.spark.mirrors")),
    ("spark", ("plugin_framework.spark",)),
    ("cli", ("plugin_framework.cli",)),
]
# Layers whose prefixes are wings side by side: a module of one imports no other one's.
APART = frozenset({"spark wings"})

# What emitters and contrib may import from plugin_framework: these modules, public names.
PUBLIC_API = frozenset({"plugin_framework", "plugin_framework.framework",
                        "plugin_framework.pgtypes", "plugin_framework.pgtypes.oids",
                        "plugin_framework.protocol"})
# The spark emitter is the Spark layer's emitter: it may also use that package's public names.
EXTRA_API: dict[str, frozenset[str]] = {"emitters.spark": frozenset({"plugin_framework.spark"})}

MAX_LINES = 600
# Lower caps for every module under a path: spark/'s wings, cut to size when it was
# re-housed, stay so.
MAX_LINES_UNDER = {"plugin_framework/spark/": 400}
# PostgreSQL function tables: one entry per function, long by nature.
SIZE_ALLOWED = frozenset({"plugin_framework/rowfilter/functions.py"})

# Violations accepted for now, each with its reason (test_known_violations_are_still_there
# says when one is fixed and should go).
KNOWN: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Module:
    name: str  # dotted
    path: Path
    is_package: bool  # an __init__.py

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    @property
    def unit(self) -> str:
        """What the package graph counts it in: its package; a module directly in
        plugin_framework, or one LAYERS names by itself (the walsender source), is a unit of
        its own, as the layers are."""
        if self.is_package:
            return self.name
        package = self.name.rpartition(".")[0]
        named = any(self.name in prefixes for _, prefixes in LAYERS)
        return self.name if package == "plugin_framework" or named else package


def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for top in TOP_PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join(parts)
            found[name] = Module(name, path, is_package)
    return found


MODULES = modules()


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (ours), resolved
    names: tuple[str, ...]  # the names taken from it (from ... import names)


def resolve(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports(module: Module) -> Iterator[Import]:
    """Every import of one of our modules, anywhere in ``module``."""
    tree = ast.parse(module.path.read_text(), str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in TOP_PACKAGES:
                    yield Import(module.name, owner(alias.name), ())
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, node)
            if base.split(".")[0] not in TOP_PACKAGES:
                continue
            plain: list[str] = []
            if base in MODULES and module.name.startswith(base + "."):
                # "from its_own_package import x" runs the package's __init__ first: that
                # is an import of the package, whatever x is.
                yield Import(module.name, base, ())
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:  # from package import submodule
                    yield Import(module.name, sub, ())
                else:
                    plain.append(alias.name)
            if plain:
                yield Import(module.name, owner(base), tuple(plain))


def owner(name: str) -> str:
    """The module of ours that a dotted import name denotes (a compiled extension, which
    has no source here, counts as its package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


ALL_IMPORTS = [i for m in MODULES.values() for i in imports(m) if i.target and
               i.target != i.source]


def placed(name: str) -> tuple[int, str] | None:
    """The layer of module ``name`` and the prefix that puts it there (the longest)."""
    best: tuple[int, str] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact_only = prefix == "plugin_framework"
            matches = name == prefix or (not exact_only and name.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    return best


def layer_of(name: str) -> int | None:
    found = placed(name)
    return None if found is None else found[0]


def apart(source: str, target: str) -> bool:
    """Whether ``source`` importing ``target`` crosses from one wing to another of a layer
    whose wings stand side by side (APART)."""
    mine, theirs = placed(source), placed(target)
    return (mine is not None and theirs is not None and mine[0] == theirs[0]
            and LAYERS[mine[0]][0] in APART and mine[1] != theirs[1])


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations() -> set[str]:
    found: set[str] = set()
    for cycle in cycles((i.source, i.target) for i in ALL_IMPORTS):
        found.add("module cycle: " + ", ".join(cycle))
    # A package's __init__ re-exporting its own subpackage (plugin_framework.framework
    # re-exports framework.reorder's Pipeline) is containment, not a dependency between units;
    # a subpackage using its parent's modules is.
    units = {(MODULES[i.source].unit, MODULES[i.target].unit) for i in ALL_IMPORTS
             if not (MODULES[i.source].is_package
                     and MODULES[i.target].unit.startswith(i.source + "."))}
    for cycle in cycles((a, b) for a, b in units if a != b):
        found.add("package cycle: " + ", ".join(cycle))
    for imp in ALL_IMPORTS:
        top = imp.source.split(".")[0]
        if top == "plugin_framework":
            mine = layer_of(imp.source)
            if mine is None:
                found.add(f"unlayered: {imp.source} (add it to LAYERS)")
                continue
            if imp.target.split(".")[0] != "plugin_framework":
                found.add(f"layer: {imp.source} ({LAYERS[mine][0]}) -> {imp.target} "
                          f"({imp.target.split('.')[0]})")
                continue
            theirs = layer_of(imp.target)
            if theirs is not None and theirs > mine:
                found.add(f"layer: {imp.source} ({LAYERS[mine][0]}) -> {imp.target} "
                          f"({LAYERS[theirs][0]})")
            elif apart(imp.source, imp.target):
                found.add(f"wing: {imp.source} -> {imp.target} ({LAYERS[mine][0]} stand "
                          "side by side)")
        else:  # emitters, contrib
            target_top = imp.target.split(".")[0]
            if target_top == "emitters" and top == "emitters":
                continue
            if imp.target not in PUBLIC_API | EXTRA_API.get(imp.source, frozenset()):
                found.add(f"api: {imp.source} -> {imp.target}")
            for name in imp.names:
                if name.startswith("_"):
                    found.add(f"api: {imp.source} -> {imp.target}.{name}")
    for module in MODULES.values():
        lines = len(module.path.read_text().splitlines())
        cap = min([MAX_LINES, *(n for path, n in MAX_LINES_UNDER.items()
                                if module.rel.startswith(path))])
        if lines > cap and module.rel not in SIZE_ALLOWED:
            found.add(f"size: {module.rel}")
    return found


def test_the_checker_sees_the_tree() -> None:
    assert "plugin_framework.cli" in MODULES and "emitters.json" in MODULES
    edges = {(i.source, i.target) for i in ALL_IMPORTS}
    assert ("plugin_framework.cli.commands", "plugin_framework.app") in edges
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    assert layer_of("plugin_framework") == layer_of("plugin_framework.framework.model")
    assert layer_of("plugin_framework.pgtypes.oids") == 2
    changes, columns, wings, ways, source = (
        layer_of(f"plugin_framework.spark.{m}") or 0 for m in (
            "changes.builder", "columns.types", "mirrors.template", "foreachbatch.plugin",
            "datasource.reader"))
    assert changes < columns < wings == ways == source
    assert apart("plugin_framework.spark.mirrors.mergeinto",
                 "plugin_framework.spark.foreachbatch.lazyframe")
    assert not apart("plugin_framework.spark.mirrors.delta", "plugin_framework.spark.mirrors.keys")
    assert not apart("plugin_framework.spark.mirrors.delta", "plugin_framework.spark.settings")


def test_layers_sizes_and_cycles() -> None:
    new = sorted(violations() - KNOWN)
    assert not new, "\n".join(new)


def test_known_violations_are_still_there() -> None:
    fixed = sorted(KNOWN - violations())
    if fixed:
        pytest.fail("fixed, remove from KNOWN in tests/package/test_layers.py:\n"
                    + "\n".join(fixed))
