"""Readiness of one proxy replica: can it serve a turn right now?

Owns the ``/readyz`` verdict. Readiness is about serving: a replica is ready when at least
one backend worker answers ``/health`` and it can make a completed turn durable, in the
database or on its own disk (``TurnWriter.disk_ok``: the last journal or spool write
succeeded). A database outage alone does not take a replica out of service (turns are
spooled and replayed); it is reported apart, under ``database``, for operators and alerts.

Contract: ``check_readiness`` asks the database (``Store.ping``) and every backend worker
at once, each bounded by ``timeout_s``, and never raises. ``Readiness.to_json(detailed)``
is the body: without ``detailed`` (a caller without the admin key) only the verdict and
which parts are down, never a backend URL or a database error text.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy.backend import SGLangBackend
from recorder.store import Store
from recorder.writer import TurnWriter


@dataclass(frozen=True, slots=True)
class Readiness:
    database: bool
    database_error: str | None
    backends: dict[str, bool]
    disk_ok: bool
    spooled_turns: int

    @property
    def durable(self) -> bool:
        return self.database or self.disk_ok

    @property
    def ready(self) -> bool:
        return self.durable and any(self.backends.values())

    def to_json(self, *, detailed: bool) -> dict[str, object]:
        body: dict[str, object] = {
            "status": "ready" if self.ready else "unavailable",
            "database": {"ok": self.database},
            "recorder": {"durable": self.durable, "disk_ok": self.disk_ok},
            "backends": {"ok": sum(self.backends.values()), "total": len(self.backends)},
        }
        if detailed:
            body["database"] = {"ok": self.database, "error": self.database_error}
            body["recorder"] = {
                "durable": self.durable,
                "disk_ok": self.disk_ok,
                "spooled_turns": self.spooled_turns,
            }
            body["backends"] = [{"url": url, "ok": ok} for url, ok in self.backends.items()]
        return body


async def check_readiness(
    store: Store, backend: SGLangBackend, writer: TurnWriter, *, timeout_s: float = 1.0
) -> Readiness:
    database_error, backends = await asyncio.gather(
        _database_error(store, timeout_s), backend.probe()
    )
    return Readiness(
        database_error is None, database_error, backends, writer.disk_ok, writer.spooled_pending
    )


async def _database_error(store: Store, timeout_s: float) -> str | None:
    try:
        await asyncio.wait_for(store.ping(), timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s} s"
    # Readiness reports any failure instead of raising it: the answer is the point.
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
