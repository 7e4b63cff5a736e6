"""Emitters from entry points: a separately packaged plugin, built and installed by pip,
discovered by `pgdecode emitters` and driven end to end from a live slot and a capture."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.workload import create_schema, run_workload

# Slow: it installs entry points and runs the command in new processes.
# `pytest -m "not server and not slow"`, the quick in-process suite, leaves it out.
pytestmark = pytest.mark.slow

TESTS = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The sample emitter, installed by pip into a directory of its own."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(target), str(TESTS / "data" / "sample_emitter")],
        check=True, capture_output=True, timeout=600,
    )
    yield target


def pgdecode(site: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "plugin_framework.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=check)


def test_listed_with_distribution_and_callbacks(site: Path) -> None:
    out = pgdecode(site, "emitters").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["sample"][1:3] == ["pgdecode-sample-emitter", "1.2.3"]
    assert rows["sample"][3] == "begin,change,commit,startup"
    assert rows["sample-hooks"][3] == "begin,change,commit"
    assert "text" in rows and "json" in rows  # the built-in ones are there too


def test_allowlist_limits_what_loads(site: Path) -> None:
    out = pgdecode(site, "emitters", "--emitter-allowlist", "sample").stdout
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["sample"]
    result = pgdecode(site, "replay", "/nonexistent", "--emitter", "sample",
                      "--emitter-allowlist", "text", check=False)
    assert result.returncode == 1


def test_unknown_emitter_names_the_installed_ones(site: Path, tmp_path: Path) -> None:
    result = pgdecode(site, "replay", str(tmp_path / "none"), "--emitter", "nope", check=False)
    assert result.returncode == 1
    assert 'no emitter named "nope" is installed' in result.stderr
    assert "sample" in result.stderr


def test_driven_end_to_end_from_a_slot_and_a_capture(site: Path, db: Any,
                                                      tmp_path: Path) -> None:
    conn = db.connect(autocommit=True)
    create_schema(conn)
    for slot in ("cap", "live"):  # capturing consumes its slot
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                   (f"{db.dbname}_{slot}",))
    facts = run_workload(conn, prepared=False)
    common = ["-d", db.conninfo, "--publication", "pub", "-E", str(facts.end_lsn), "-q"]
    capture = tmp_path / "stream.cap"
    pgdecode(site, "capture", *common, "-S", f"{db.dbname}_cap", "-f", str(capture))
    live = tmp_path / "live.out"
    pgdecode(site, "stream", *common, "-S", f"{db.dbname}_live", "--emitter", "sample",
             "-o", "prefix=>", "-f", str(live))
    replayed = pgdecode(site, "replay", str(capture), "--emitter", "sample",
                        "-o", "prefix=>").stdout
    lines = live.read_text().splitlines()
    assert lines == replayed.splitlines()
    assert ">items INSERT id=1" in lines and ">items DELETE id=2" in lines
    inserts = sum(1 for line in lines if line.startswith(">bulk INSERT"))
    assert inserts == facts.counts["bulk"]  # committed rows only: the aborts never arrive
    hooks = pgdecode(site, "replay", str(capture), "--emitter", "sample-hooks").stdout
    assert hooks.splitlines()[:2] == [f"begin {facts.xids['insert']}", "items INSERT"]


def test_an_emitter_that_cannot_import_is_reported_not_raised(tmp_path: Path) -> None:
    pkg = tmp_path / "broken"
    (pkg / "broken_emitter").mkdir(parents=True)
    (pkg / "broken_emitter" / "__init__.py").write_text("import no_such_module_here\n")
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "broken-emitter"\nversion = "0.1"\n'
        '[project.entry-points."pgdecode.emitters"]\nbroken = "broken_emitter:Plugin"\n'
        "[tool.setuptools]\npackages = [\"broken_emitter\"]\n")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(target), str(pkg)], check=True, capture_output=True, timeout=600)
    listed = pgdecode(target, "emitters").stdout
    assert "(cannot load:" in next(line for line in listed.splitlines()
                                   if line.startswith("broken "))
    result = pgdecode(target, "replay", str(tmp_path / "x.cap"), "--emitter", "broken",
                      check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert 'emitter "broken" (from broken-emitter 0.1) is installed but cannot be loaded' \
        in result.stderr
    assert "No module named 'no_such_module_here'" in result.stderr
