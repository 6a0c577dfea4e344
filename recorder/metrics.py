"""The recorder's Prometheus metrics, registered on a registry its owner injects.

Owns the names and help texts of everything the write path counts (``lego_recorder_*``).
``proxy.metrics.Metrics`` passes its private per-app registry, so one ``/metrics`` page
shows both; a tool or test that wants none passes no ``RecorderMetrics`` at all. Gauges
that describe live state (pending turns, the spool) read it when scraped.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class RecorderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.pending = Gauge(
            "lego_recorder_pending_turns", "Turns waiting to be written.", registry=r
        )
        self.write_failures = Gauge(
            "lego_recorder_write_failures",
            "Failed database write attempts since start.",
            registry=r,
        )
        self.spooled = Counter(
            "lego_recorder_spooled_turns",
            "Turns written to the local spool because the database was down or slow.",
            registry=r,
        )
        self.replayed = Counter(
            "lego_recorder_replayed_turns",
            "Spooled turns replayed into the database.",
            registry=r,
        )
        self.dropped = Counter(
            "lego_recorder_dropped_turns",
            "Turns the database can never accept (logged and dropped).",
            registry=r,
        )
        self.quarantined = Counter(
            "lego_recorder_quarantined_turns",
            "Turns the database refused for good: kept in the quarantine spool and replaced "
            "by a row it takes (see lego_recorder_dropped_turns for those it refused too).",
            registry=r,
        )
        self.late = Counter(
            "lego_recorder_late_turns",
            "Turns that reached the database after their session finished (stored failed).",
            registry=r,
        )
        self.undurable = Counter(
            "lego_recorder_undurable_turns",
            "Completed turns failed because neither the disk nor the database took them.",
            registry=r,
        )
        self.disk_failures = Gauge(
            "lego_recorder_disk_failures",
            "Journal or spool writes the disk refused since start.",
            registry=r,
        )
        self.disk_ok = Gauge(
            "lego_recorder_disk_ok",
            "1 while the last journal or spool write succeeded, 0 after a refused one.",
            registry=r,
        )
        self.spool_bytes = Gauge(
            "lego_recorder_spool_bytes", "Bytes waiting in the local spool.", registry=r
        )
        self.spool_turns = Gauge(
            "lego_recorder_spool_turns", "Turns waiting in the local spool.", registry=r
        )
        self.spool_age = Gauge(
            "lego_recorder_spool_oldest_age_seconds",
            "Age of the oldest spooled turn (0 when the spool is empty).",
            registry=r,
        )
        self.written_at_once = Counter(
            "lego_recorder_written_at_once_turns",
            "Turns committed by their own request, with no hand-off to the writer's task "
            "(a turn alone in flight, on a database the event loop writes to).",
            registry=r,
        )
        self.write_latency = Histogram(
            "lego_recorder_write_latency_seconds",
            "Duration of one database write of a batch of turns.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
