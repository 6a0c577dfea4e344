"""A scratch Postgres on loopback for tests, benchmarks and trials: the server given in
``LEGO_TEST_POSTGRES_URL``, or a throwaway cluster started here. Nothing in the serving path
imports it.

Contract:
- ``running_postgres()`` is a context manager yielding a ``PostgresServer``. With
  ``LEGO_TEST_POSTGRES_URL`` set it wraps that server (any ``postgresql://`` URL whose user
  may create databases); otherwise it runs ``initdb`` and ``pg_ctl`` in a temporary
  directory on a free loopback port (as the ``postgres`` OS user when running as root),
  and removes everything on exit. It raises ``PostgresUnavailable`` when no binaries exist.
- ``PostgresServer.create_database()`` makes a fresh, uniquely named database and returns
  its ``postgresql+asyncpg://`` URL; ``drop_database(url)`` removes it.
- ``stop()``/``start()`` restart a cluster started here (tests of database outages);
  ``owned`` says whether that is possible.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from kernel.errors import LegoError

ENV_URL = "LEGO_TEST_POSTGRES_URL"


class PostgresUnavailable(LegoError):
    """No Postgres was given and none can be started here."""


class PostgresServer:
    def __init__(self, admin_url: URL, *, cluster: _Cluster | None = None) -> None:
        self._admin_url = admin_url
        self._cluster = cluster

    @property
    def owned(self) -> bool:
        return self._cluster is not None

    def url_for(self, database: str) -> str:
        url = self._admin_url.set(drivername="postgresql+asyncpg", database=database)
        return url.render_as_string(hide_password=False)

    async def create_database(self, prefix: str = "lego_test") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        await self._admin(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    async def drop_database(self, url: str) -> None:
        name = make_url(url).database
        await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        if self._cluster is None:
            raise PostgresUnavailable("only a cluster started by the tests can be stopped")
        self._cluster.stop()

    def start(self) -> None:
        if self._cluster is None:
            raise PostgresUnavailable("only a cluster started by the tests can be started")
        self._cluster.start()

    async def _admin(self, statement: str) -> None:
        # CREATE/DROP DATABASE cannot run inside a transaction.
        engine = create_async_engine(
            self.url_for(self._admin_url.database or "postgres"), isolation_level="AUTOCOMMIT"
        )
        try:
            async with engine.connect() as conn:
                await conn.exec_driver_sql(statement)
        finally:
            await engine.dispose()


class _Cluster:
    """A throwaway cluster under a temporary directory."""

    def __init__(self, bindir: Path, root: Path, port: int, run_as: str | None) -> None:
        self.bindir = bindir
        self.data = root / "data"
        self.root = root
        self.port = port
        self.run_as = run_as

    def _run(self, *args: str) -> None:
        command = list(args)
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr or done.stdout}"
            )

    def init(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            "30",
            "-o",
            options,
            "start",
        )

    def stop(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


def find_bindir() -> Path | None:
    """Directory holding initdb and pg_ctl: pg_config's, then Debian's layout, then PATH."""
    candidates: list[Path] = []
    if pg_config := shutil.which("pg_config"):
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            candidates.append(Path(done.stdout.strip()))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(Path(p) for p in versions)
    if initdb := shutil.which("initdb"):
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as_user() -> str | None:
    """Postgres refuses to run as root: use the ``postgres`` OS user then."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable("running as root and no 'postgres' OS user exists") from None
    if shutil.which("runuser") is None:
        raise PostgresUnavailable("running as root and 'runuser' is not available")
    return "postgres"


@contextmanager
def running_postgres(*, own: bool = False) -> Iterator[PostgresServer]:
    """``own``: always a throwaway cluster of our own (tests that stop and restart it)."""
    given = os.environ.get(ENV_URL)
    if given and not own:
        yield PostgresServer(make_url(given))
        return
    bindir = find_bindir()
    if bindir is None:
        raise PostgresUnavailable(
            f"no Postgres binaries (initdb, pg_ctl) found and {ENV_URL} is not set"
        )
    run_as = _run_as_user()
    root = Path(tempfile.mkdtemp(prefix="lego-pg-"))
    try:
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        cluster = _Cluster(bindir, root, _free_port(), run_as)
        cluster.init()
        cluster.start()
        try:
            admin = URL.create(
                "postgresql",
                username="postgres",
                host="127.0.0.1",
                port=cluster.port,
                database="postgres",
            )
            yield PostgresServer(admin, cluster=cluster)
        finally:
            # A test may have left it stopped; the directory is removed regardless.
            with contextlib.suppress(PostgresUnavailable):
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
