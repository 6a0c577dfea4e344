"""Everything one proxy app holds, built once by ``create_app`` and passed explicitly."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.conversations import ConversationBook
from proxy.metrics import Metrics
from proxy.pipeline import Pipeline
from proxy.sessions import SessionCache
from proxy.settings import Settings
from recorder.store import Store
from recorder.writer import TurnWriter


@dataclass(frozen=True, slots=True)
class AppState:
    settings: Settings
    metrics: Metrics
    store: Store
    writer: TurnWriter
    sessions: SessionCache
    pipeline: Pipeline
    conversations: ConversationBook  # completed turns' whole requests (previous_response_id)
    served_model_name: str
    models_response: Callable[[Sequence[str], int], bytes]
