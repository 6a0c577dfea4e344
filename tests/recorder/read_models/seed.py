"""Synthetic runs written straight into the recorder's tables, for read-model and UI tests.

``seed_run`` inserts one run with announced weight versions, sessions grouped by prompt
and turns (a root turn plus ``turns - 1`` extends per session), with rewards, output
lengths and malformed counts chosen by the caller per session. Optionally, per session:
the stage times its trial reported (``stages``) and an ``edited_history`` fork of its last
turn (``fork``: the task message edited, one tool result added, recorded as the ledger
records one, its prompt ids stored linearly after the prefix it shares); per version:
validation sessions (``validation``: one single-turn sample per held-out task); group
ids named as the rollout runner names them (``epoch_groups``: ``<task>.e<epoch>``, epoch
by epoch, task by task); trainer steps flagged with reasons (``flagged``). It returns
what it wrote so tests compute expected numbers independently of the UI's SQL.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson
from sqlalchemy import insert

from recorder import codec
from recorder.database import create_engine
from recorder.schema import alignment_reports, runs, sessions, turns, weight_versions

Row = dict[str, object]

# The fork's prompt against its parent's tokens (prompt 1 2 3, then the sampled ids):
# the first two kept, 3 replaced by 7, the sampled ids kept, two ids added at the end.
FORK_SHARED = 2
FORK_EDIT = (7,)
FORK_ADDED = (60, 61)
EDITED_SUFFIX = " (edited)"


@dataclass(frozen=True)
class SeededSession:
    id: str
    task_id: str
    group_id: str
    version: str
    termination: str | None
    reward: float | None
    turns: int  # a fork included
    output_tokens: int  # per turn
    malformed: int  # in the last turn of the main branch
    purpose: str = "train"
    stages: Mapping[str, float] | None = None
    turn_ids: tuple[str, ...] = ()  # in order of arrival
    forked: bool = False  # its last turn is an edited_history fork of the one before


@dataclass(frozen=True)
class SeededRun:
    id: str
    name: str
    versions: tuple[str, ...]
    sessions: tuple[SeededSession, ...]
    flagged: Mapping[int, Sequence[str]] = field(default_factory=dict)

    @property
    def train(self) -> tuple[SeededSession, ...]:
        return tuple(s for s in self.sessions if s.purpose == "train")

    @property
    def validation(self) -> tuple[SeededSession, ...]:
        return tuple(s for s in self.sessions if s.purpose == "validation")


Outcome = tuple[str | None, float | None, int, int, int]
SessionPlan = Callable[[int, int], Outcome]
"""(version index, sample number) -> (termination, reward, turns, output tokens, malformed)."""
StagePlan = Callable[[int, int], Mapping[str, float] | None]
"""(version index, sample number) -> the stage seconds its trial reported, or None."""
ForkPlan = Callable[[int, int], bool]
"""(version index, sample number) -> whether an edited_history fork ends the session."""
ValidationPlan = Callable[[int], Sequence[tuple[str | None, float | None]]]
"""version index -> (termination, reward) of each validation session sampled with it."""


@dataclass
class _Writer:
    """The rows of one run, gathered before one transaction writes them."""

    run_id: str
    sessions: list[Row] = field(default_factory=list)
    turns: list[Row] = field(default_factory=list)
    seeded: list[SeededSession] = field(default_factory=list)

    def add(
        self,
        version: str,
        task_id: str,
        group_id: str,
        k: int,
        created: float,
        outcome: Outcome,
        purpose: str = "train",
        trial: Mapping[str, float] | None = None,
        forked: bool = False,
    ) -> None:
        termination, reward, n_turns, n_out, malformed = outcome
        session_id = uuid.uuid4().hex
        self.sessions.append(
            {
                "id": session_id,
                "key": f"lego-sk-{session_id}",
                "run_id": self.run_id,
                "task_id": task_id,
                "group_id": group_id,
                "sample_index": k,
                "harness": "seed",
                "sampling": {},
                "status": "finished" if termination else "active",
                "termination": termination,
                "reward": reward,
                "created_at": created,
                "purpose": purpose,
                "stages": dict(trial) if trial is not None else None,
            }
        )
        out = tuple(range(100, 100 + n_out))
        rows = _turn_rows(session_id, task_id, version, created, n_turns, out, malformed)
        if forked:
            rows.append(_fork_row(rows[-1], task_id, n_turns, out))
        self.turns.extend(rows)
        self.seeded.append(
            SeededSession(
                id=session_id,
                task_id=task_id,
                group_id=group_id,
                version=version,
                termination=termination,
                reward=reward,
                turns=len(rows),
                output_tokens=n_out,
                malformed=malformed,
                purpose=purpose,
                stages=trial,
                turn_ids=tuple(str(row["id"]) for row in rows),
                forked=forked,
            )
        )


async def seed_run(
    database_url: str,
    *,
    versions: int,
    groups_per_version: int,
    group_size: int,
    plan: SessionPlan,
    alignment: list[dict[str, float | None]] | None = None,
    tasks: int | None = None,
    stages: StagePlan | None = None,
    fork: ForkPlan | None = None,
    validation: ValidationPlan | None = None,
    epoch_groups: bool = False,
    flagged: Mapping[int, Sequence[str]] | None = None,
) -> SeededRun:
    engine = create_engine(database_url)
    run_id = uuid.uuid4().hex
    name = f"seeded-{run_id[:8]}"
    now = time.time()
    version_names = tuple(f"v{i:03d}" for i in range(versions))
    writer = _Writer(run_id)
    for v, version in enumerate(version_names):
        for g in range(groups_per_version):
            if epoch_groups:
                assert tasks, "epoch groups need a task count"
                index = v * groups_per_version + g
                task_id = f"task-{index % tasks}"
                group_id = f"{task_id}.e{index // tasks}"
            else:
                task_id = f"task-{g % tasks if tasks else g}"
                group_id = f"g{v}-{g}"
            for k in range(group_size):
                n = g * group_size + k
                writer.add(
                    version,
                    task_id,
                    group_id,
                    k,
                    now + v * 100 + g + k / 100,
                    plan(v, n),
                    trial=stages(v, n) if stages else None,
                    forked=bool(fork and fork(v, n)),
                )
        for i, (termination, reward) in enumerate(validation(v) if validation else ()):
            writer.add(
                version,
                f"val-{i}",
                f"val-{i}.v{v}",
                0,
                now + v * 100 + 90 + i / 100,
                (termination, reward, 1, 4, 0),
                purpose="validation",
            )
    reasons = dict(flagged or {})
    async with engine.begin() as conn:
        await conn.execute(insert(runs).values(id=run_id, name=name, created_at=now))
        await conn.execute(
            insert(weight_versions),
            [
                {"run_id": run_id, "idx": i, "version": v, "created_at": now + i}
                for i, v in enumerate(version_names)
            ],
        )
        await conn.execute(insert(sessions), writer.sessions)
        if writer.turns:
            await conn.execute(insert(turns), writer.turns)
        if alignment:
            await conn.execute(
                insert(alignment_reports),
                [
                    {
                        "run_id": run_id,
                        "step": step,
                        "weight_version": version_names[min(step, versions - 1)],
                        "metrics": metrics,
                        "flagged": int(step in reasons),
                        "reasons": list(reasons.get(step, ())) or None,
                        "created_at": now + step,
                    }
                    for step, metrics in enumerate(alignment)
                ],
            )
    await engine.dispose()
    return SeededRun(run_id, name, version_names, tuple(writer.seeded), reasons)


def _messages(task_id: str, seq: int) -> list[Row]:
    """The request of a session's turn ``seq``: the task, then each earlier exchange."""
    messages: list[Row] = [{"role": "user", "content": f"solve {task_id}"}]
    for i in range(seq):
        messages += [
            {"role": "assistant", "content": f"step {i}"},
            {"role": "tool", "content": f"result {i}", "tool_call_id": f"c{i}"},
        ]
    return messages


def _answer(seq: int) -> bytes:
    call = {"id": f"c{seq}", "name": "bash", "arguments": "{}"}
    return orjson.dumps({"content": f"step {seq}", "reasoning": None, "tool_calls": [call]})


def _turn_rows(
    session_id: str,
    task_id: str,
    version: str,
    created: float,
    n_turns: int,
    out: tuple[int, ...],
    malformed: int,
) -> list[Row]:
    rows: list[Row] = []
    parent: str | None = None
    for seq in range(n_turns):
        turn_id = uuid.uuid4().hex
        request = {"adapter": "openai_chat", "messages": _messages(task_id, seq)}
        rows.append(
            {
                "id": turn_id,
                "session_id": session_id,
                "seq": seq,
                "adapter": "openai_chat",
                "requested_model": "seed-model",
                "status": "completed",
                "finish_reason": "stop",
                "weight_version": version,
                "prompt_ids": codec.encode_ids((1, 2, 3)),
                "output_ids": codec.encode_ids(out),
                "logprobs": codec.encode_logprobs(tuple(-0.01 * i for i in out)),
                "sampling_params": {},
                "request_messages": orjson.dumps(request),
                "response_message": _answer(seq),
                "ignored_fields": [],
                "malformed_tool_calls": malformed if seq == n_turns - 1 else 0,
                "resumptions": 0,
                "parent_turn_id": parent,
                "classification": "extend" if parent else "root",
                # Every row names every column a fork sets: an executemany takes the
                # first row's keys and would drop the others' silently.
                "fork_reason": None,
                "prompt_offset": 0,
                "reused_prefix_len": 0,
                "received_at": created + seq,
                "first_token_s": 0.01,
                "finished_s": 0.05,
                "backend_s": 0.04,
                "created_at": created + seq,
            }
        )
        parent = turn_id
    return rows


def _fork_row(parent: Row, task_id: str, seq: int, out: tuple[int, ...]) -> Row:
    """An edited_history fork of ``parent`` (turn ``seq - 1``): the task message edited,
    every exchange kept, then the parent's answer and a new tool result."""
    messages = _messages(task_id, seq)
    messages[0] = {"role": "user", "content": f"solve {task_id}{EDITED_SUFFIX}"}
    messages[-2] = {
        "role": "assistant",
        "content": f"step {seq - 1}",
        "tool_calls": [{"id": f"c{seq - 1}", "name": "bash", "arguments": "{}"}],
    }
    prompt = (1, 2, 3)[:FORK_SHARED] + FORK_EDIT + out + FORK_ADDED
    created = float(str(parent["created_at"])) + 1
    return {
        **parent,
        "id": uuid.uuid4().hex,
        "seq": seq,
        "prompt_ids": codec.encode_ids(prompt[FORK_SHARED:]),
        "prompt_offset": FORK_SHARED,
        "reused_prefix_len": FORK_SHARED,
        "request_messages": orjson.dumps({"adapter": "openai_chat", "messages": messages}),
        "response_message": _answer(seq),
        "malformed_tool_calls": 0,
        "parent_turn_id": parent["id"],
        "classification": "fork",
        "fork_reason": "edited_history",
        "received_at": created,
        "created_at": created,
    }
