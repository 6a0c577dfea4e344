"""Fixtures for the harness suite: the pinned programs, one scripted stack, a run table.

Every module here is marked ``harness`` (deselected by default; ``make test-harness``
runs them). ``installed`` runs ``install.sh`` (a no-op when the cache's stamp matches the
pins). ``stack`` is one engine + tap + proxy for the session; each test makes its own
proxy session and its own workspace. Every run adds a ``RunReport``; the table is printed
at the end of the session (turns, classification counts, wall time per harness run).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from recorder.scratch_postgres import PostgresServer
from tests.harness.checks import RunReport
from tests.harness.harnesses import Installed
from tests.harness.policy import SCRIPT
from tests.harness.stack import HarnessStack, harness_stack

ROOT = Path(__file__).resolve().parents[2]


def default_cache() -> Path:
    """Outside the checkout, so fresh clones on the same machine (CI) reuse the installs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lego-proxy" / "harness"


INSTALL = Path(__file__).with_name("install.sh")
_REPORTS = pytest.StashKey[list[RunReport]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reports = terminalreporter.config.stash.get(_REPORTS, [])
    if reports:
        terminalreporter.section("harness runs")
        for run in reports:
            terminalreporter.write_line(run.line())


@pytest.fixture(scope="session")
def installed() -> Installed:
    cache = Path(os.environ.get("LEGO_HARNESS_CACHE", default_cache()))
    done = subprocess.run(
        ["bash", str(INSTALL)],
        env={**os.environ, "LEGO_HARNESS_CACHE": str(cache)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"installing the harnesses failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return Installed(cache)


@pytest.fixture(scope="session")
async def stack(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[HarnessStack]:
    """SQLite (the embedded default), or Postgres where CI provides one."""
    server: PostgresServer | None = None
    database_url = None
    if os.environ.get("LEGO_TEST_POSTGRES_URL"):
        server = request.getfixturevalue("postgres_server")
        database_url = await server.create_database()
    data_dir = tmp_path_factory.mktemp("harness-proxy")
    with harness_stack(tiny_model_dir, SCRIPT, data_dir, database_url) as running:
        yield running
    if server is not None and database_url is not None:
        await server.drop_database(database_url)


@dataclass(frozen=True)
class Workspace:
    cwd: Path
    home: Path


@pytest.fixture
def workspace(tmp_path: Path, stack: HarnessStack) -> Workspace:
    stack.tap.reset()
    (tmp_path / "work").mkdir()
    (tmp_path / "home").mkdir()
    return Workspace(tmp_path / "work", tmp_path / "home")


@pytest.fixture
def reports(request: pytest.FixtureRequest) -> list[RunReport]:
    return request.config.stash.setdefault(_REPORTS, [])
