"""What a command loads before it does anything: every command reads the row filter options
and quotes names, few have row filters or catalog queries. PostgreSQL's parser (pglast) and
the row filter compiler are loaded by the commands that use them: loaded by every other
command too, they would add a third to the instructions of its start-up (valgrind)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.streamkit import cli_command, cli_env

pytestmark = pytest.mark.slow  # (starts the command)


def _imported(*args: str) -> set[str]:
    """The modules the command imported, from ``python -X importtime``'s report."""
    command = cli_command(*args)
    command.insert(1, "-Ximporttime")
    result = subprocess.run(command, env=cli_env(), capture_output=True, text=True,
                            timeout=120)
    names = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "plugin_framework.app" in names, result.stderr[-2000:]
    return names


def test_a_stream_without_row_filters_does_not_load_the_parser_or_the_filter_compiler(
        tmp_path: Path) -> None:
    # No server listens there: the command fails connecting, after its start-up.
    names = _imported("stream", "-d", f"host={tmp_path} dbname=none", "-S", "s", "-f",
                      "/dev/null", "--emitter", "json")
    assert not {n for n in names if n.split(".")[0] == "pglast"}
    loaded = {n for n in names if n.startswith("plugin_framework.rowfilter.")}
    assert loaded <= {"plugin_framework.rowfilter.config", "plugin_framework.rowfilter.errors"}
