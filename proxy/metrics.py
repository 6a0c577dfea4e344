"""The proxy's Prometheus metrics, on a private registry created per app.

Owns metric names and labels. ``create_app`` builds one ``Metrics`` and everything that
counts gets it passed in; ``/metrics`` renders its registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.turn_duration = Histogram(
            "lego_turn_duration_seconds",
            "Request received to last output event.",
            ["adapter"],
            buckets=_LATENCY_BUCKETS,
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
        self.ignored_fields = Counter(
            "lego_ignored_request_fields",
            "Request fields accepted but not used.",
            ["adapter", "field"],
            registry=r,
        )
        self.recorder_pending = Gauge(
            "lego_recorder_pending_turns", "Turns waiting to be written.", registry=r
        )
        self.recorder_write_failures = Gauge(
            "lego_recorder_write_failures",
            "Failed database write attempts since start.",
            registry=r,
        )
        self.sessions_finished = Counter(
            "lego_sessions_finished",
            "Sessions finished by termination reason.",
            ["termination"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
