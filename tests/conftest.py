"""Fixtures for tests against real servers.

``pg`` is one running cluster per available server version (the embedded PostgreSQL 18, then
each system installation of another major version), shared by the whole session; tests that use
it, directly or through ``db``, run once per version and are marked ``server``. ``db`` is a
fresh database for one test, ``pg_module_db`` one shared by a module's tests, and
``workload_capture`` tests/support/workload.py's transactions in a slot of that one.
"""

from __future__ import annotations

import compileall
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from support.pgtest import (
    BINDIRS,
    TEST_SETTINGS,
    TestDatabase,
    create_database,
    drop_database,
)
from support.streamkit import WorkloadCapture, capture_workload, cli_env, install_probes

import plugin_framework
from plugin_framework._native import impl
from plugin_framework.cluster import LocalCluster, server_major_version

# Hypothesis's deadline (200 ms per example) and its too_slow health check (on drawing the
# inputs) are timing assertions, which no test here may make: on a machine busy with a soak
# loop beside the suite they failed test_quote_identifier_quotes_exactly_where_needed (an
# example that took 300 ms once, 15 ms again) and test_truncations_raise_protocol_errors.
# Inputs too large for their strategy are still refused (data_too_large and the others).
settings.register_profile("pgdecode", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pgdecode")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The package compiled once, before the tests start pgdecode commands (hundreds of
    them) and Spark's Python workers: with PYTHONDONTWRITEBYTECODE set, as on CI machines,
    each of those processes would otherwise compile every module it imports (0.2 s of the
    0.5 s a command takes to start); the probes' commands import tests/support too."""
    if not hasattr(session.config, "workerinput"):  # the controller of xdist's workers
        for package in (Path(plugin_framework.__file__).parent, Path(__file__).parent / "support"):
            compileall.compile_dir(package, quiet=1)


@pytest.fixture(
    scope="session",
    params=BINDIRS,
    ids=[f"pg{server_major_version(b)}" for b in BINDIRS],
)
def pg(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    cluster = LocalCluster(request.param, settings=TEST_SETTINGS)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture
def db(pg: LocalCluster) -> Iterator[TestDatabase]:
    database = create_database(pg)
    try:
        yield database
    finally:
        drop_database(database)


@pytest.fixture(scope="module")
def pg_module_db(pg: LocalCluster) -> Iterator[TestDatabase]:
    database = create_database(pg)
    try:
        yield database
    finally:
        drop_database(database)


@pytest.fixture(scope="module")
def workload_capture(pg_module_db: TestDatabase) -> WorkloadCapture:
    """tests/support/workload.py's transactions, in a two-phase slot of the module's database."""
    return capture_workload(pg_module_db)


@pytest.fixture(scope="session")
def probes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' probe emitters, installed once as entry points (see streamkit)."""
    return install_probes(tmp_path_factory.mktemp("probes"))


@pytest.fixture
def env(probes: Path) -> dict[str, str]:
    """The environment for running the pgdecode command with the probes installed."""
    return cli_env(probes)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true",
                     help="run the soak tests too (kill -9 and randomized workloads over the "
                          "sinks that hold a table's state, minutes each; .ci/soak runs them "
                          "in a loop)")


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("--soak"):
        return None
    return "soak tests not run (kill -9 and randomized-workload loops): .ci/soak runs them"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    python_only = impl() == "python"
    soak = config.getoption("--soak")
    kept, left = [], []
    for item in items:
        if "pg" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.server)
        if python_only and item.get_closest_marker("native"):
            item.add_marker(pytest.mark.skip(reason="PGDECODE_IMPL=python: no C module runs"))
        (left if item.get_closest_marker("soak") and not soak else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
