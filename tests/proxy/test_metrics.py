"""proxy.metrics: labelled series looked up once per label values, counted as
``labels()`` counts them."""

from __future__ import annotations

import pytest

from proxy.metrics import Metrics


def sample(metrics: Metrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_child_is_looked_up_once_and_counts_in_its_series() -> None:
    metrics = Metrics()
    first = metrics.child(metrics.turns, adapter="openai_chat", status="completed")
    assert metrics.child(metrics.turns, adapter="openai_chat", status="completed") is first
    first.inc()
    metrics.child(metrics.turns, status="completed", adapter="openai_chat").inc()  # other order
    metrics.child(metrics.turns, adapter="openai_chat", status="failed").inc()
    completed = {"adapter": "openai_chat", "status": "completed"}
    assert sample(metrics, "lego_turns_total", completed) == 2
    assert sample(metrics, "lego_turns_total", {**completed, "status": "failed"}) == 1


def test_the_same_values_on_two_metrics_are_two_children() -> None:
    metrics = Metrics()
    metrics.child(metrics.turn_duration, adapter="anthropic_messages").observe(0.5)
    metrics.child(metrics.added_latency, adapter="anthropic_messages").observe(0.25)
    labels = {"adapter": "anthropic_messages"}
    assert sample(metrics, "lego_turn_duration_seconds_sum", labels) == 0.5
    assert sample(metrics, "lego_added_latency_seconds_sum", labels) == 0.25


def test_a_wrong_label_name_is_refused_as_labels_refuses_it() -> None:
    metrics = Metrics()
    with pytest.raises(ValueError, match="label"):
        metrics.child(metrics.turns, adapter="openai_chat", state="completed")
