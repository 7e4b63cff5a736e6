"""PGDECODE_IMPL chooses between pgdecode's C modules and the Python code they mirror, in one
place (plugin_framework/_native.py), and ``pgdecode --version`` says which run."""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest
from support.streamkit import cli_command

from plugin_framework.cli.parser import NATIVE_USERS

pytestmark = pytest.mark.slow  # (starts the command)


def _version(impl: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PGDECODE_IMPL"}
    if impl is not None:
        env["PGDECODE_IMPL"] = impl
    return subprocess.run(cli_command("--version"), env=env, capture_output=True, text=True,
                          timeout=120)


def _modules(output: str) -> dict[str, str]:
    return dict(line.strip().split(": ", 1) for line in output.splitlines()
                if line.startswith("  "))


def test_each_c_module_runs_where_it_is_built_unless_python_is_asked_for() -> None:
    default, python = _version(None), _version("python")
    assert default.returncode == python.returncode == 0, default.stderr + python.stderr
    modules = _modules(default.stdout)
    assert len(modules) >= len(NATIVE_USERS) - 1, default.stdout
    for module, status in modules.items():
        built = importlib.util.find_spec(module) is not None
        assert status == ("c" if built else "python (not built)"), (module, status)
    assert _modules(python.stdout) == {m: "python (PGDECODE_IMPL=python)" for m in modules}


def test_an_unknown_implementation_is_refused_naming_the_choices() -> None:
    result = _version("rust")
    assert result.returncode != 0
    assert "PGDECODE_IMPL='rust' is not an implementation" in result.stderr
