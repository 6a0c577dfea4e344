"""The proxy's Prometheus metrics, on a private registry created per app.

Owns the proxy's metric names and labels. ``create_app`` builds one ``Metrics`` and
everything that counts gets it passed in; ``/metrics`` renders its registry, which also
holds the recorder's metrics (``recorder.metrics``, registered here as ``recorder``).

Every label whose values come from a caller is bounded, so no request can grow the series
without limit (a scrape must stay small and fast): ``ignored_field(name)`` gives the label
for a request field name, the first ``MAX_FIELD_LABELS`` distinct names as themselves
(up to ``MAX_LABEL_CHARS`` characters), every later one as ``OTHER``; at most
``MAX_ALIGNMENT_METRICS`` alignment gauges exist, later metric names are not exported.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kernel.heap import FullCollections
from recorder.metrics import LATENCY_BUCKETS, RecorderMetrics

_STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32)
MAX_FIELD_LABELS = 128
MAX_LABEL_CHARS = 64
MAX_ALIGNMENT_METRICS = 64
OTHER = "_other"
M = TypeVar("M", Counter, Gauge, Histogram)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.recorder = RecorderMetrics(r)  # the write path's own, on this registry
        self.requests = Counter(
            "lego_requests",
            "Inference requests by adapter and HTTP status.",
            ["adapter", "status"],
            registry=r,
        )
        self.turns = Counter(
            "lego_turns",
            "Recorded turns by adapter and status.",
            ["adapter", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "lego_time_to_first_token_seconds",
            "Request received to first output event.",
            ["adapter"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.turn_duration = Histogram(
            "lego_turn_duration_seconds",
            "Request received to last output event.",
            ["adapter"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "lego_prompt_tokens", "Prompt tokens sent to the backend.", registry=r
        )
        self.completion_tokens = Counter(
            "lego_completion_tokens", "Tokens sampled by the backend.", registry=r
        )
        self.malformed_tool_calls = Counter(
            "lego_malformed_tool_calls",
            "Tool calls the parser could not read (sent as text).",
            registry=r,
        )
        self.backend_errors = Counter(
            "lego_backend_errors", "Backend failures by kind.", ["kind"], registry=r
        )
        self.backend_aborts = Counter(
            "lego_backend_aborts",
            "Backend generations that ended in abort, by cause.",
            ["cause"],
            registry=r,
        )
        self.ledger = Counter(
            "lego_ledger_turns",
            "Turns by history-ledger classification and fork reason.",
            ["classification", "reason"],
            registry=r,
        )
        self.ledger_relabels = Counter(
            "lego_ledger_relabels",
            "Turns re-labelled after lego_ledger_turns counted them (a root found to be a side "
            "request): they are counted under both labels there, so subtract these from 'was'.",
            ["was", "classification", "reason"],
            registry=r,
        )
        self.ledger_reloads = Counter(
            "lego_ledger_reloads",
            "Checks of a session's recorded turns after a root or fork plan, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.pause_sync_failures = Counter(
            "lego_pause_sync_failures",
            "Failed reads of the paused runs (the gate keeps its last known state).",
            registry=r,
        )
        self.ignored_fields = Counter(
            "lego_ignored_request_fields",
            "Request fields accepted but not used.",
            ["adapter", "field"],
            registry=r,
        )
        self.sessions_finished = Counter(
            "lego_sessions_finished",
            "Sessions finished by termination reason.",
            ["termination"],
            registry=r,
        )
        self.paused_waits = Counter(
            "lego_paused_turn_waits",
            "New turns that waited for a paused run, by outcome (resumed | rejected).",
            ["outcome"],
            registry=r,
        )
        self.added_latency = Histogram(
            "lego_added_latency_seconds",
            "Turn duration minus time spent waiting on the backend: the proxy's own cost.",
            ["adapter"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.export_claims = Counter(
            "lego_export_claims",
            "Export claims answered, by whether they delivered any group (hit | empty).",
            ["outcome"],
            registry=r,
        )
        self.export_claimed_groups = Counter(
            "lego_export_claimed_groups", "Prompt groups handed to trainers.", registry=r
        )
        self.export_lease_expiries = Counter(
            "lego_export_lease_expiries",
            "Batch leases that expired before their ack (their groups return to the pool).",
            registry=r,
        )
        self.export_staleness = Histogram(
            "lego_export_staleness_versions",
            "Staleness of delivered groups: announced weight versions behind the current one.",
            buckets=_STALENESS_BUCKETS,
            registry=r,
        )
        self.export_broken_groups = Counter(
            "lego_export_broken_groups",
            "Groups left out of exports for good: a session's recorded turns do not chain.",
            registry=r,
        )
        self.export_stale_groups = Counter(
            "lego_export_stale_groups",
            "Complete groups held back by a claim's max_staleness.",
            registry=r,
        )
        self.alignment_step = Gauge(
            "lego_alignment_step",
            "Latest trainer step that reported alignment.",
            ["run"],
            registry=r,
        )
        self.alignment_flagged = Counter(
            "lego_alignment_flagged_steps",
            "Trainer steps whose rollout/trainer alignment was flagged.",
            ["run"],
            registry=r,
        )
        # Read at scrape time from ``watch_collections``' numbers (``kernel.heap``); a
        # reclaim's pass is counted with the others.
        self.gc_full_collections = Gauge(
            "lego_gc_full_collections",
            "Full passes of the process's garbage collector while serving; each stops every "
            "turn in flight.",
            registry=r,
        )
        self.gc_full_collection_seconds = Gauge(
            "lego_gc_full_collection_seconds",
            "Time spent in those passes, in all.",
            registry=r,
        )
        self.gc_longest_full_collection = Gauge(
            "lego_gc_longest_full_collection_seconds",
            "The longest of those passes.",
            registry=r,
        )
        self.gc_reclaims = Gauge(
            "lego_gc_reclaims",
            "Full passes over the frozen long-lived heap too, to free the garbage frozen in it.",
            registry=r,
        )
        self._alignment: dict[str, Gauge] = {}
        self._field_labels: set[str] = set()
        self._children: dict[tuple[int, tuple[str, ...]], object] = {}

    def watch_collections(self, seen: FullCollections) -> None:
        """Report ``seen``'s numbers from now on."""
        self.gc_full_collections.set_function(lambda: seen.count)
        self.gc_full_collection_seconds.set_function(lambda: seen.seconds)
        self.gc_longest_full_collection.set_function(lambda: seen.longest_s)
        self.gc_reclaims.set_function(lambda: seen.reclaims)

    def child(self, metric: M, **labels: str) -> M:
        """``metric.labels(**labels)``, looked up once: every turn counts itself in several
        labelled series, and ``labels()`` costs 2 us each time (its argument checks and
        lock), a dictionary lookup 0.3. Label values are bounded (module docstring), so
        is this cache. Keyed by the values in the caller's order: a call site that names
        them in another order gets the same child under a key of its own."""
        key = (id(metric), tuple(labels.values()))
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(**labels)
        return found  # type: ignore[return-value]  # stored as M for this metric

    def ignored_field(self, name: str) -> str:
        """The bounded label of an ignored request field (see the module docstring)."""
        if name in self._field_labels:
            return name
        if len(name) > MAX_LABEL_CHARS or len(self._field_labels) >= MAX_FIELD_LABELS:
            return OTHER
        self._field_labels.add(name)
        return name

    def alignment_gauge(self, metric: str) -> Gauge | None:
        """``lego_alignment_<metric>{run}``, created on first use (metric names come from
        the trainer's report; non-identifier characters become ``_``); None past the
        bound."""
        name = "".join(c if c.isalnum() or c == "_" else "_" for c in metric).lower()
        gauge = self._alignment.get(name)
        if gauge is None and len(self._alignment) >= MAX_ALIGNMENT_METRICS:
            return None
        if gauge is None:
            gauge = Gauge(
                f"lego_alignment_{name}",
                f"Rollout/trainer alignment: {name} at the latest reported step.",
                ["run"],
                registry=self.registry,
            )
            self._alignment[name] = gauge
        return gauge

    def render(self) -> bytes:
        return generate_latest(self.registry)
