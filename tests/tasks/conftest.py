"""Fixtures of the tasks suite: the real bwrap backend, a pool of generated tasks and their
images, built once per session (a cache the tests share, as rollouts share one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.bwrap import Bwrap
from tasks.generated import make_task
from tasks.images import TaskImage, build_image
from tasks.spec import Task, load_task


@pytest.fixture(scope="session")
def bwrap(tmp_path_factory: pytest.TempPathFactory) -> Bwrap:
    return Bwrap(runtime_dir=tmp_path_factory.mktemp("sandbox-runtime"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("task-cache")


@pytest.fixture(scope="session")
def pool_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pool = tmp_path_factory.mktemp("pool")
    make_task(pool, "calc-ok")
    make_task(pool, "calc-setup-fails", variant="setup_fails")
    make_task(pool, "calc-broken-tests", variant="broken_test_command")
    return pool


@pytest.fixture(scope="session")
def ok_task(pool_dir: Path) -> Task:
    return load_task(pool_dir / "calc-ok")


@pytest.fixture(scope="session")
def ok_image(ok_task: Task, cache_dir: Path, bwrap: Bwrap) -> TaskImage:
    return build_image(ok_task, cache_dir, bwrap)
