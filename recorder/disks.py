"""Where a proxy's recorder keeps turns on disk: spool, journal and quarantine directories.

Owns the layout under a data directory, per database (``Store.identity``)::

    spool/db-<id>/<host>-<instance>/          this proxy's spool (kept across restarts)
    journal/db-<id>/<host>-<instance>-<ns>/   this process's journal (one per start)
    quarantine/db-<id>/<host>-<instance>/     turns the database refused, for inspection

``instance`` is the proxy's port, or ``<port>.w<i>`` for worker ``i`` of
``serve --workers`` (the workers share the port, each has its own directories).

Contract:
- ``spool(instance)``, ``journal(instance)`` and ``quarantine(instance)`` open (and lock) this
  proxy's directories; ``orphans()`` the spools and journals under the same database's
  roots that no live process holds (their proxy died), for the writer to replay and then
  remove. A directory of another database is never opened, so no turn is replayed into a
  database it was not written for.
- A spool or journal directory left directly under ``spool/`` or ``journal/`` (written
  before databases were told apart) is never replayed; ``orphans()`` logs each one that
  still holds turns, naming where to move it to have it replayed.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

from recorder.spool import SEGMENT_SUFFIX, Spool

log = logging.getLogger(__name__)

_PREFIX = "db-"


class RecorderDisks:
    def __init__(self, data_dir: Path, identity: str) -> None:
        self._data_dir = data_dir
        self._database = f"{_PREFIX}{identity}"
        self._host = socket.gethostname()
        self._journal: Path | None = None
        self._spool: Path | None = None

    def _root(self, kind: str) -> Path:
        return self._data_dir / kind / self._database

    def spool(self, instance: int | str) -> Spool:
        self._spool = self._root("spool") / f"{self._host}-{instance}"
        return Spool.open(self._spool)

    def journal(self, instance: int | str) -> Spool:
        # Per process start: what a killed process journaled is an orphan the next replays.
        directory = self._root("journal") / f"{self._host}-{instance}-{time.time_ns()}"
        self._journal = directory
        return Spool.open(directory)

    def quarantine(self, instance: int | str) -> Spool:
        return Spool.open(self._root("quarantine") / f"{self._host}-{instance}")

    def orphans(self) -> list[Spool]:
        """Call after ``spool`` and ``journal``: this proxy's own are not orphans."""
        for kind in ("spool", "journal"):
            self._warn_legacy(self._data_dir / kind)
        none = Path("-")
        return [
            *Spool.orphans(self._root("spool"), self._spool or none),
            *Spool.orphans(self._root("journal"), self._journal or none),
        ]

    def _warn_legacy(self, root: Path) -> None:
        if not root.is_dir():
            return
        for directory in sorted(root.iterdir()):
            if directory.name.startswith(_PREFIX) or not directory.is_dir():
                continue
            if any(directory.glob(f"*{SEGMENT_SUFFIX}")):
                log.warning(
                    "recorder: %s holds turns written before databases were told apart; "
                    "they are not replayed. Move it under %s to replay it into this database",
                    directory,
                    root / self._database,
                )
