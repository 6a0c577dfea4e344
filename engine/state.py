"""``EngineState``: the per-app mutable state of one local engine (``app.state.engine``).

Owns what the HTTP handlers share: the loaded tokenizer and backend, the server's length
limits, the weight version being served, the pause switch (``resumed``: new requests wait
while it is clear, as SGLang's ``is_pause_cond``) and the model-update lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.admission import Limits
from engine.config import EngineConfig
from engine.jobs import Backend
from engine.script import ScriptedPolicy
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

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))
