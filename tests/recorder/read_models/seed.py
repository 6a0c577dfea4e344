"""Synthetic runs written straight into the recorder's tables, for read-model and UI tests.

``seed_run`` inserts one run with announced weight versions, sessions grouped by prompt
and turns (a root turn plus ``turns - 1`` extends per session), with rewards, output
lengths and malformed counts chosen by the caller per session. It returns what it wrote
so tests compute expected numbers independently of the UI's SQL.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from sqlalchemy import insert

from recorder import codec
from recorder.database import create_engine
from recorder.schema import alignment_reports, runs, sessions, turns, weight_versions


@dataclass(frozen=True)
class SeededSession:
    id: str
    task_id: str
    group_id: str
    version: str
    termination: str | None
    reward: float | None
    turns: int
    output_tokens: int  # per turn
    malformed: int  # in the last turn


@dataclass(frozen=True)
class SeededRun:
    id: str
    name: str
    versions: tuple[str, ...]
    sessions: tuple[SeededSession, ...]


SessionPlan = Callable[[int, int], tuple[str | None, float | None, int, int, int]]
"""(version index, sample number) -> (termination, reward, turns, output tokens, malformed)."""


async def seed_run(
    database_url: str,
    *,
    versions: int,
    groups_per_version: int,
    group_size: int,
    plan: SessionPlan,
    alignment: list[dict[str, float | None]] | None = None,
    tasks: int | None = None,
) -> SeededRun:
    engine = create_engine(database_url)
    run_id = uuid.uuid4().hex
    name = f"seeded-{run_id[:8]}"
    now = time.time()
    version_names = tuple(f"v{i:03d}" for i in range(versions))
    session_rows: list[dict[str, object]] = []
    turn_rows: list[dict[str, object]] = []
    seeded: list[SeededSession] = []
    for v, version in enumerate(version_names):
        for g in range(groups_per_version):
            group_id = f"g{v}-{g}"
            task_id = f"task-{g % tasks if tasks else g}"
            for k in range(group_size):
                termination, reward, n_turns, n_out, malformed = plan(v, g * group_size + k)
                session_id = uuid.uuid4().hex
                created = now + v * 100 + g + k / 100
                session_rows.append(
                    {
                        "id": session_id,
                        "key": f"lego-sk-{session_id}",
                        "run_id": run_id,
                        "task_id": task_id,
                        "group_id": group_id,
                        "sample_index": k,
                        "harness": "seed",
                        "sampling": {},
                        "status": "finished" if termination else "active",
                        "termination": termination,
                        "reward": reward,
                        "created_at": created,
                    }
                )
                seeded.append(
                    SeededSession(
                        session_id,
                        task_id,
                        group_id,
                        version,
                        termination,
                        reward,
                        n_turns,
                        n_out,
                        malformed,
                    )
                )
                parent: str | None = None
                for seq in range(n_turns):
                    turn_id = uuid.uuid4().hex
                    out = tuple(range(100, 100 + n_out))
                    last = seq == n_turns - 1
                    messages = [{"role": "user", "content": f"solve {task_id}"}]
                    messages += [
                        m
                        for i in range(seq)
                        for m in (
                            {"role": "assistant", "content": f"step {i}"},
                            {"role": "tool", "content": f"result {i}", "tool_call_id": f"c{i}"},
                        )
                    ]
                    turn_rows.append(
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
                            "request_messages": orjson.dumps(
                                {"adapter": "openai_chat", "messages": messages}
                            ),
                            "response_message": orjson.dumps(
                                {
                                    "content": f"step {seq}",
                                    "reasoning": None,
                                    "tool_calls": [
                                        {"id": f"c{seq}", "name": "bash", "arguments": "{}"}
                                    ],
                                }
                            ),
                            "ignored_fields": [],
                            "malformed_tool_calls": malformed if last else 0,
                            "resumptions": 0,
                            "parent_turn_id": parent,
                            "classification": "extend" if parent else "root",
                            "received_at": created + seq,
                            "first_token_s": 0.01,
                            "finished_s": 0.05,
                            "backend_s": 0.04,
                            "created_at": created + seq,
                        }
                    )
                    parent = turn_id
    async with engine.begin() as conn:
        await conn.execute(insert(runs).values(id=run_id, name=name, created_at=now))
        await conn.execute(
            insert(weight_versions),
            [
                {"run_id": run_id, "idx": i, "version": v, "created_at": now + i}
                for i, v in enumerate(version_names)
            ],
        )
        await conn.execute(insert(sessions), session_rows)
        if turn_rows:
            await conn.execute(insert(turns), turn_rows)
        if alignment:
            await conn.execute(
                insert(alignment_reports),
                [
                    {
                        "run_id": run_id,
                        "step": step,
                        "weight_version": version_names[min(step, versions - 1)],
                        "metrics": metrics,
                        "flagged": 0,
                        "created_at": now + step,
                    }
                    for step, metrics in enumerate(alignment)
                ],
            )
    await engine.dispose()
    return SeededRun(run_id, name, version_names, tuple(seeded))
