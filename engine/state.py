"""``EngineState``: the per-app mutable state of one local engine (``app.state.engine``).

Owns what the HTTP handlers share: the loaded tokenizer and backend, the server's length
limits, the weight version being served, the pause switch (``resumed``: new requests wait
while it is clear, as SGLang's ``is_pause_cond``), the model-update lock and the
weight-update groups and session (``engine.update_groups``).

``model_update()`` is how every weight route guards the model, as SGLang 0.5.23's
tokenizer manager does: while paused, whoever paused holds the model and nothing is taken;
otherwise the lock's write side, so the update waits for running requests and holds new
ones back. ``set_weight_version`` labels what live requests sampled so far with the old
version before switching.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.admission import Limits
from engine.config import EngineConfig
from engine.jobs import Backend
from engine.script import ScriptedPolicy
from engine.update_groups import UpdateGroups
from engine.weights import ModelUpdateLock


@dataclass(eq=False)
class EngineState:
    config: EngineConfig
    tokenizer: Any
    backend: Backend
    model_config: dict[str, Any]
    script: ScriptedPolicy | None
    weight_version: str
    model_path: Path
    limits: Limits
    resumed: asyncio.Event
    update_lock: ModelUpdateLock = field(default_factory=ModelUpdateLock)
    update_groups: UpdateGroups = field(default_factory=UpdateGroups)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def model_update(self) -> AbstractAsyncContextManager[None]:
        if not self.resumed.is_set():
            return nullcontext()
        return self.update_lock.writing()

    async def set_weight_version(self, version: str | None) -> None:
        if version is None or version == self.weight_version:
            return
        # Requests alive across the change (a retract or in-place pause, or a version
        # update without abort) keep the old label on what they sampled so far.
        await asyncio.to_thread(self.backend.note_weight_version, self.weight_version)
        self.weight_version = version
