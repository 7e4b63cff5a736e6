"""docs/architecture.md checked against the code, where the code can say: every file the
package table names exists where the table puts it, every module and C file of
plugin_framework is named there, and the list of modules that open connections is the list
of modules calling ``psycopg.connect``. (The layer order itself is checked by
test_layers.py, against LAYERS.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "plugin_framework"
DOC = (ROOT / "docs" / "architecture.md").read_text()
TOP = ("emitters", "contrib")
NAMED_FILE = re.compile(r"`([\w/.]+\.(?:py|c|h)|[\w/]+/)`")


def section(title: str) -> str:
    head = f"\n## {title}\n"
    assert head in DOC, f"docs/architecture.md has no section {title!r}"
    return DOC.split(head, 1)[1].split("\n## ", 1)[0]


def table_rows() -> list[tuple[list[Path], str]]:
    """The package table's rows: the paths its first cell names, and its second cell."""
    rows = []
    for line in section("What each package owns").splitlines():
        if not line.startswith("| `"):
            continue
        first, owns = [cell.strip() for cell in line.strip("|").split("|")][:2]
        heads = [ROOT / name if name.split("/")[0] in TOP else PACKAGE / name
                 for name in re.findall(r"`([^`]+)`", first)]
        rows.append((heads, owns))
    return rows


def resolve(heads: list[Path], name: str) -> list[Path]:
    """Where a name in a row's second cell is: in the row's package (or a folder of it), or
    relative to plugin_framework or the repository when it says more than a file name."""
    bases = [h if h.is_dir() else h.parent for h in heads]
    found = [base / name for base in bases if (base / name).exists()]
    found += [root / name for root in (PACKAGE, ROOT) if "/" in name and (root / name).exists()]
    if not found:
        found = [p for base in bases for p in base.rglob(Path(name).name)
                 if p.as_posix().endswith(name.rstrip("/"))]
    return found


def test_every_file_the_package_table_names_exists_where_it_says() -> None:
    missing = [(heads[0].relative_to(ROOT).as_posix(), name)
               for heads, owns in table_rows() for name in NAMED_FILE.findall(owns)
               if not resolve(heads, name)]
    assert missing == [], "docs/architecture.md names files that are not there (moved?)"


def test_every_module_of_plugin_framework_is_in_the_package_table() -> None:
    named: set[Path] = set()
    for heads, owns in table_rows():
        named.update(h.resolve() for h in heads)
        for name in NAMED_FILE.findall(owns):
            named.update(p.resolve() for p in resolve(heads, name))
    unnamed = [p.relative_to(ROOT).as_posix() for p in sorted(PACKAGE.rglob("*"))
               if p.suffix in (".py", ".c") and p.name != "__init__.py"
               and p.resolve() not in named]
    assert unnamed == [], "docs/architecture.md's package table does not name these"


def connects(path: Path) -> bool:
    """Whether a module calls psycopg.connect (or psycopg.Connection.connect)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "connect":
            root = node.func.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id == "psycopg":
                return True
    return False


def test_the_modules_that_open_connections_are_the_ones_the_doc_lists() -> None:
    listed = set(re.findall(r"^- `([\w/.]+\.py)`", section("Who talks to a server"), re.M))
    opening = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if connects(p)}
    assert opening, "no module found calling psycopg.connect: the check is broken"
    assert sorted(opening - listed) == [], "open connections, not in the doc's list"
    assert sorted(listed - opening) == [], "in the doc's list, open no connection"
