"""The Grafana dashboard in ``deploy/grafana`` charts every metric the proxy exports."""

from __future__ import annotations

import json
from pathlib import Path

from proxy.metrics import Metrics

DASHBOARD = Path(__file__).parents[3] / "deploy" / "grafana" / "lego-proxy.json"


def test_every_metric_has_a_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    )
    metrics = Metrics()
    metrics.alignment_gauge("pearson_r")
    metrics.alignment_gauge("abs_dlogp_p99")
    names = {family.name for family in metrics.registry.collect()}
    assert len(names) > 25
    missing = {name for name in names if name not in exprs}
    assert not missing
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
