"""Readiness of one proxy replica: can it serve a turn right now?

Owns the ``/readyz`` verdict. Contract: ``check_readiness`` asks the database (``Store.ping``)
and every backend worker (``/health``) at once, each bounded by ``timeout_s``, and never
raises: a replica is ready when the database answers and at least one worker does. The
verdict says which part failed, so an operator reading a 503 knows where to look.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy.backend import SGLangBackend
from recorder.store import Store


@dataclass(frozen=True, slots=True)
class Readiness:
    database: bool
    database_error: str | None
    backends: dict[str, bool]

    @property
    def ready(self) -> bool:
        return self.database and any(self.backends.values())

    def to_json(self) -> dict[str, object]:
        return {
            "status": "ready" if self.ready else "unavailable",
            "database": {"ok": self.database, "error": self.database_error},
            "backends": [{"url": url, "ok": ok} for url, ok in self.backends.items()],
        }


async def check_readiness(
    store: Store, backend: SGLangBackend, *, timeout_s: float = 1.0
) -> Readiness:
    database_error, backends = await asyncio.gather(
        _database_error(store, timeout_s), backend.probe()
    )
    return Readiness(database_error is None, database_error, backends)


async def _database_error(store: Store, timeout_s: float) -> str | None:
    try:
        await asyncio.wait_for(store.ping(), timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s} s"
    # Readiness reports any failure instead of raising it: the answer is the point.
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
