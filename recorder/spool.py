"""The durable local spool: where encoded turns wait while the database is down or slow.

Owns one directory per proxy (``LEGO_DATA_DIR/spool/<proxy id>``), held with an exclusive
``flock`` on ``.lock`` for the life of the ``Spool`` so two live processes never share it;
a directory whose lock nobody holds belongs to a proxy that died and may be adopted
(``orphans``) and replayed by another.

File format: append-only segment files ``seg-<first append, ns>.spool``, each a sequence of
frames ``b"LGS1" | u32 payload length | u32 crc32(payload) | payload`` (little-endian).
A payload is one ``StoredTurn`` row: ``u32 header length | header JSON | blobs``, the
header holding every scalar column and the byte length of each binary column (``None``
for NULL). Rows are already in the linear storage encoding, so the spool grows with new
tokens only, like the database.

Contract:
- ``append(rows)`` writes every frame of the batch with one ``write`` and ``fsync``s the
  file (and, for a new segment, the directory) before returning: a returned append
  survives a crash of the process or the machine. It blocks; call it in a thread.
- ``rotate()`` closes the segment being appended to; ``closed_segments()`` lists segments no
  append will touch again, oldest first. ``read(segment)`` decodes a segment's frames in
  order; a torn or corrupt frame ends the segment (everything before it is returned, the
  rest is counted in ``corrupt_frames``, the file is kept as ``*.corrupt`` for inspection
  when ``remove`` is called). ``remove(segment)`` deletes a replayed segment.
- ``size_bytes``, ``records`` and ``oldest_age_s()`` describe what is waiting (metrics).
- ``discard()``, after ``close()``, removes the directory of a spool whose every segment
  was replayed (an orphan's, or a journal's), so dead processes leave nothing behind;
  a directory still holding a segment (or a ``*.corrupt`` file) is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from kernel.errors import RecorderError
from recorder.rows import BLOB_COLUMNS, StoredTurn

log = logging.getLogger(__name__)

MAGIC = b"LGS1"
_FRAME = struct.Struct("<4sII")
_U32 = struct.Struct("<I")
LOCK_FILE = ".lock"
SEGMENT_SUFFIX = ".spool"
MAX_SEGMENT_BYTES = 64 * 1024 * 1024  # bounds what one replay step reads into memory


@dataclass(slots=True)
class _SegmentInfo:
    """Bookkeeping for one segment file (private, mutated by the owning ``Spool``)."""

    first_append: float  # epoch seconds
    records: int
    size: int


def encode_row(turn: StoredTurn) -> bytes:
    meta: dict[str, object] = {k: v for k, v in turn.row.items() if k not in BLOB_COLUMNS}
    blobs: list[bytes | None] = []
    for name in BLOB_COLUMNS:
        value = turn.row.get(name)
        if value is not None and not isinstance(value, bytes):
            raise TypeError(f"column {name} must hold bytes, not {type(value).__name__}")
        blobs.append(value)
    meta["_blobs"] = [None if b is None else len(b) for b in blobs]
    head = orjson.dumps(meta)
    return _U32.pack(len(head)) + head + b"".join(b for b in blobs if b)


def decode_row(payload: bytes) -> StoredTurn:
    (head_len,) = _U32.unpack_from(payload, 0)
    meta = orjson.loads(payload[4 : 4 + head_len])
    lengths = meta.pop("_blobs")
    row: dict[str, object] = dict(meta)
    at = 4 + head_len
    for name, length in zip(BLOB_COLUMNS, lengths, strict=True):
        if length is None:
            row[name] = None
        else:
            row[name] = payload[at : at + length]
            at += length
    if at != len(payload):
        raise ValueError(f"spool record has {len(payload) - at} trailing bytes")
    # Spooled by a proxy older than migration 0005: its request is whole.
    row.setdefault("messages_inherited", None)
    return StoredTurn(id=str(row["id"]), row=row)


class Spool:
    def __init__(self, directory: Path, lock_fd: int) -> None:
        self.directory = directory
        self._lock_fd = lock_fd
        self._current: Path | None = None
        self._current_fd: int | None = None
        self._segments: dict[Path, _SegmentInfo] = {}
        # append() runs in worker threads; a shutdown may spill while one is still running.
        self._lock = threading.Lock()
        self.corrupt_frames = 0
        for path in sorted(directory.glob(f"*{SEGMENT_SUFFIX}")):
            records = len(self._frames(path))
            stat = path.stat()
            self._segments[path] = _SegmentInfo(stat.st_mtime, records, stat.st_size)

    @classmethod
    def open(cls, directory: Path) -> Spool:
        """Create/lock ``directory``; ``RecorderError`` if another live process holds it."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise RecorderError(f"cannot open spool {directory}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise RecorderError(f"spool {directory} is held by another process") from exc
        return cls(directory, fd)

    @staticmethod
    def orphans(root: Path, own: Path) -> Iterator[Spool]:
        """Spools under ``root`` that no live process holds (their proxy died), locked."""
        if not root.is_dir():
            return
        for directory in sorted(root.iterdir()):
            if not directory.is_dir() or directory.resolve() == own.resolve():
                continue
            try:
                yield Spool.open(directory)
            except RecorderError:
                continue  # a live proxy owns it and replays it itself

    def close(self) -> None:
        self.rotate()
        os.close(self._lock_fd)

    def discard(self) -> None:
        left = [p for p in self.directory.iterdir() if p.name != LOCK_FILE]
        if left:
            log.warning("spool %s kept: it still holds %s", self.directory, left[0].name)
            return
        (self.directory / LOCK_FILE).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another process just opened it: it is theirs
            self.directory.rmdir()

    # -- metrics --------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        return sum(info.size for info in self._segments.values())

    @property
    def records(self) -> int:
        return sum(info.records for info in self._segments.values())

    def oldest_age_s(self) -> float:
        if not self._segments:
            return 0.0
        return max(0.0, time.time() - min(i.first_append for i in self._segments.values()))

    # -- writing --------------------------------------------------------------
    def append(self, rows: Sequence[StoredTurn]) -> None:
        if not rows:
            return
        frames = []
        for turn in rows:
            payload = encode_row(turn)
            frames.append(_FRAME.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload)
        data = b"".join(frames)
        with self._lock:
            self._append_locked(data, len(rows))

    def _append_locked(self, data: bytes, count: int) -> None:
        fd = self._segment_fd()
        assert self._current is not None
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
        info = self._segments[self._current]
        info.records += count
        info.size += len(data)
        if info.size >= MAX_SEGMENT_BYTES:
            self._rotate_locked()

    def _segment_fd(self) -> int:
        if self._current_fd is not None:
            return self._current_fd
        now = time.time()
        path = self.directory / f"seg-{time.time_ns():020d}{SEGMENT_SUFFIX}"
        self._current_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._current = path
        self._segments[path] = _SegmentInfo(now, 0, 0)
        # The new file's directory entry must be durable too, or a crash could lose it.
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return self._current_fd

    def rotate(self) -> None:
        with self._lock:
            self._rotate_locked()

    def _rotate_locked(self) -> None:
        if self._current_fd is not None:
            os.close(self._current_fd)
        self._current_fd = None
        self._current = None

    # -- replaying ------------------------------------------------------------
    def closed_segments(self) -> list[Path]:
        return sorted(path for path in self._segments if path != self._current)

    def read(self, segment: Path) -> list[StoredTurn]:
        return [decode_row(payload) for payload in self._frames(segment)]

    def remove(self, segment: Path) -> None:
        self._segments.pop(segment, None)
        if parse_frames(segment.read_bytes())[1] is not None:
            segment.rename(segment.with_suffix(".corrupt"))
        else:
            segment.unlink(missing_ok=True)

    def _frames(self, path: Path) -> list[bytes]:
        payloads, torn_at = parse_frames(path.read_bytes())
        if torn_at is not None:
            # Deliberately not raised: every frame before it is intact and must still be
            # replayed. A torn tail is what a crash in the middle of an append leaves.
            self.corrupt_frames += 1
            log.error("spool %s: torn or corrupt frame at byte %d; rest skipped", path, torn_at)
        return payloads


def parse_frames(data: bytes) -> tuple[list[bytes], int | None]:
    """The intact frames' payloads, and the offset of the first bad frame (None if none)."""
    payloads: list[bytes] = []
    at = 0
    while at < len(data):
        if len(data) - at < _FRAME.size:
            return payloads, at
        magic, length, crc = _FRAME.unpack_from(data, at)
        payload = data[at + _FRAME.size : at + _FRAME.size + length]
        if magic != MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
            return payloads, at
        payloads.append(payload)
        at += _FRAME.size + length
    return payloads, None
