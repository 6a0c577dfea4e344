"""What every harness run must show in the recorded session, as reusable assertions.

Owns ``RunReport`` (turns, classification counts, wall time: the suite's closing table)
and the checks: ``main_segment`` (the branch holding the harness's agent loop: a root, then
only ``extend`` turns), ``assert_loss_mask_is_sampled`` (every loss-masked run of every
segment is exactly the output ids one backend ``/generate`` returned, and everything
before it is exactly the prompt ids that generate received), and ``turns_by_kind``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tests.support.tap import BackendTap


@dataclass(frozen=True)
class RunReport:
    harness: str
    scenario: str
    turns: int
    classifications: dict[str, int]
    wall_s: float

    def line(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.classifications.items()))
        head = f"{self.harness:<12} {self.scenario:<15} turns={self.turns:<3}"
        return f"{head} {kinds:<60} {self.wall_s:6.1f} s"


def kind(turn: dict[str, Any]) -> str:
    reason = turn["fork_reason"]
    return f"{turn['classification']}/{reason}" if reason else str(turn["classification"])


def turns_by_kind(trajectory: dict[str, Any]) -> dict[str, int]:
    return dict(Counter(kind(t) for t in trajectory["turns"] if t["status"] == "completed"))


def report(harness: str, scenario: str, trajectory: dict[str, Any], wall_s: float) -> RunReport:
    counts = Counter(
        kind(t) if t["status"] == "completed" else str(t["status"]) for t in trajectory["turns"]
    )
    return RunReport(harness, scenario, len(trajectory["turns"]), dict(counts), wall_s)


def main_segment(trajectory: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The first segment and its turns; asserts it is a root followed only by extends."""
    by_id = {t["id"]: t for t in trajectory["turns"]}
    segment = trajectory["segments"][0]
    turns = [by_id[i] for i in segment["turn_ids"]]
    assert [kind(t) for t in turns] == ["root"] + ["extend"] * (len(turns) - 1), turns
    return segment, turns


def _masked_runs(mask: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    start = None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def assert_loss_mask_is_sampled(trajectory: dict[str, Any], tap: BackendTap) -> None:
    """Invariant 5 against the wire: mask 1 exactly on what the backend sampled."""
    # Cumulative chunks: the last one holds everything a generate sampled (a dropped
    # stream's partial output matches no recorded run, as it must not).
    sampled = [
        (tuple(e.body["input_ids"]), tuple(e.final["output_ids"]))
        for e in tap.generates
        if e.chunks
    ]
    by_id = {t["id"]: t for t in trajectory["turns"]}
    for segment in trajectory["segments"]:
        tokens, mask = segment["tokens"], segment["loss_mask"]
        assert len(tokens) == len(mask) == len(segment["logprobs"])
        runs = _masked_runs(mask)
        assert len(runs) == len(segment["turn_ids"]), (runs, segment["turn_ids"])
        for (start, end), turn_id in zip(runs, segment["turn_ids"], strict=True):
            exchange = (tuple(tokens[:start]), tuple(tokens[start:end]))
            assert exchange in sampled, f"turn {turn_id}: masked run is not a sampled output"
            turn = by_id[turn_id]
            assert turn["prompt_tokens"] == start
            assert turn["completion_tokens"] == end - start
