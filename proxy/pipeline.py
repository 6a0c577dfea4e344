"""The one pipeline that runs a harness turn, whatever the wire protocol.

Owns: prompt budget checks, SGLang sampling parameters (session overrides win), the backend
generation with transparent resumption after a pause-abort, incremental parsing of the
sampled ids into output events, and building the ``TurnRecord`` handed to the recorder.

Contract:
- ``prepare`` plans the prompt ids with the history ledger (an exact continuation of an
  earlier turn, or a classified fork) and checks budgets; it raises before anything is
  sent or recorded, so bad input never leaves a half-written turn.
- ``admit`` holds a new turn while its run is paused for a weight sync (429 past a bound).
- ``run`` yields ``OutputEvent``s as the backend produces tokens and ends with one
  ``TurnFinished``. Every backend generation it started is recorded exactly once: a
  completed turn is committed to the ledger (so the next request can extend it: the
  books add it in the loop's next pass and before any read, ``proxy.deferred``) and
  handed to the recorder before that last event, which waits (boundedly) until the turn is
  durable: in the database when it is up, so every replica sees it before the harness
  does; a turn the recorder cannot make durable, or that the database took after its
  session was finished, raises instead of ending; a turn that ends otherwise is recorded
  when the generator ends, ``failed`` when the backend or the parser failed (the error is
  re-raised for the adapter), ``cancelled`` when the consumer went away (the backend
  request is aborted by ``rid``).
- One harness request makes one backend generation, plus re-sends of ``prompt + partial
  output`` when the backend aborted it for a pause or weight update.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from kernel.errors import BackendError, Conflict, ContextLengthExceeded, LegoError
from proxy.backend import Finish, GenerateCall, GenerationEnd, SGLangBackend
from proxy.backend_wire import GenerationDelta
from proxy.canonical import (
    ChatRequest,
    FinishReason,
    Message,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolChoiceMode,
    TurnFinished,
    Usage,
)
from proxy.conversation_rules import check_conversation
from proxy.conversations import ConversationBook, EncodedRequest, recorded_requests
from proxy.gate import RunGate
from proxy.ledger import Classification, ForkReason, LedgerBook, PromptPlan
from proxy.ledger.codec import answer_of
from proxy.metrics import Metrics
from proxy.parsing.parser import OutputParser, parser_special_ids
from proxy.settings import Settings, ToolParser
from proxy.tokens import TokenIds
from recorder.records import RoutedExperts, SessionInfo, TurnRecord, TurnStatus, TurnTimings
from recorder.store import Store
from recorder.writer import Durability, TurnWriter

# Keys the orchestrator may pin per session, in canonical names, and their SGLang names.
SESSION_SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "sampling_seed",
    "max_tokens": "max_new_tokens",
}


@dataclass(frozen=True, slots=True)
class PreparedTurn:
    turn_id: str
    session: SessionInfo
    request: ChatRequest
    plan: PromptPlan
    prompt_ids: TokenIds
    sampling_params: dict[str, object]
    starts_in_reasoning: bool
    received_at: float
    started: float  # perf_counter at receipt


@dataclass(slots=True)
class _Message:
    """The parsed answer as the harness received it, kept for inspection."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)

    def add(self, event: OutputEvent) -> None:
        if isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, TextDelta):
            self.content.append(event.text)
        elif isinstance(event, ToolCallDelta):
            self.tool_calls.append(event.call)

    def canonical(self) -> Message:
        return Message(
            role="assistant",
            content="".join(self.content),
            reasoning="".join(self.reasoning) if self.reasoning else None,
            tool_calls=tuple(self.tool_calls),
        )


class _Draft:
    """What a turn's answer and record need that its answer does not change: the output
    parser, and the request as stored (``ConversationBook.encode``). ``fill`` builds both
    (the pipeline runs it while the engine works); each is built at first use otherwise.

    The encoding stays valid if the conversation book lets the parent go in between: it
    names a parent that is recorded, which is what reading it back needs."""

    __slots__ = ("_encoded", "_parent", "_parser", "_pipeline", "_turn")

    def __init__(self, pipeline: Pipeline, turn: PreparedTurn) -> None:
        self._pipeline = pipeline
        self._turn = turn
        self._parser: OutputParser | None = None
        self._encoded: EncodedRequest | None = None
        self._parent = turn.plan.parent_turn_id

    def fill(self) -> None:
        try:
            _ = self.parser
            self.encoded(self._parent)
        except Exception:
            # Deliberately swallowed: built again where it is used, which raises there, in
            # the turn's own context (this runs as a loop callback).
            return

    @property
    def parser(self) -> OutputParser:
        if self._parser is None:
            self._parser = self._pipeline.parser(self._turn)
        return self._parser

    def encoded(self, parent_turn_id: str | None) -> EncodedRequest:
        """The request as stored for ``parent_turn_id`` (the plan's; a settled plan keeps
        its parent, so this is the drafted one)."""
        if parent_turn_id != self._parent:
            return self._pipeline.encode_request(self._turn, parent_turn_id)
        if self._encoded is None:
            self._encoded = self._pipeline.encode_request(self._turn, parent_turn_id)
        return self._encoded


@dataclass(slots=True)
class _Progress:
    """What one turn has produced so far (mutable, owned by one ``run``)."""

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    end: GenerationEnd | None = None
    message: _Message = field(default_factory=_Message)
    resumptions: int = 0
    rid: str = ""  # of the backend call in flight (each resumption has its own)
    first_token_s: float | None = None
    backend_s: float = 0.0
    spans: list[tuple[str, int, int]] = field(default_factory=list)  # per backend call
    abandoned: bool = False  # the harness hung up; the backend was asked to abort


class Pipeline:
    def __init__(
        self,
        *,
        settings: Settings,
        tokenizer: PreTrainedTokenizerBase,
        tool_parser: ToolParser,
        ledger: LedgerBook,
        conversations: ConversationBook,
        backend: SGLangBackend,
        store: Store,
        writer: TurnWriter,
        metrics: Metrics,
        gate: RunGate | None = None,
    ) -> None:
        self._gate = gate
        self._settings = settings
        self._tokenizer = tokenizer
        self._special_ids = parser_special_ids(tokenizer)  # once, not per turn
        self._tool_parser = tool_parser
        self._ledger = ledger
        self._conversations = conversations
        self._backend = backend
        self._store = store
        self._writer = writer
        self._metrics = metrics
        self._background: set[asyncio.Task[None]] = set()
        self._running: dict[str, _Progress] = {}  # turn id -> its run's progress
        self._think_tails: dict[tuple[int, ...], bool] = {}  # last prompt ids -> in <think>

    def parser(self, turn: PreparedTurn) -> OutputParser:
        """A new parser of ``turn``'s sampled ids (``_Draft``)."""
        request = turn.request
        return OutputParser(
            tokenizer=self._tokenizer,
            tool_parser=self._tool_parser,
            tools=request.tools,
            stop=request.sampling.stop,
            call_id_prefix=f"call_{turn.turn_id[:16]}_",
            starts_in_reasoning=turn.starts_in_reasoning,
            tools_enabled=request.tool_choice.mode is not ToolChoiceMode.NONE,
            special_ids=self._special_ids,
        )

    def encode_request(self, turn: PreparedTurn, parent_turn_id: str | None) -> EncodedRequest:
        """``turn``'s request as its record stores it (``_Draft``)."""
        return self._conversations.encode(turn.session.id, parent_turn_id, turn.request)

    def abandon(self, turn_id: str) -> bool:
        """The harness of a running turn hung up: abort the backend call in flight and let
        the turn end as SGLang ends an aborted request, whose last chunk holds every token
        sampled (a chunk every N tokens included), so the cancelled turn's record is whole.
        False when the turn is not generating (not started, or past its generation): the
        caller cancels it instead."""
        progress = self._running.get(turn_id)
        if progress is None or progress.abandoned:
            return False
        progress.abandoned = True
        self._metrics.backend_aborts.labels(cause="client_disconnect").inc()
        self._spawn(self._backend.abort(progress.rid or turn_id))
        return True

    def forget(self, session_id: str) -> None:
        """Drop a finished session's ledger and conversations (it takes no more turns)."""
        self._ledger.forget(session_id)
        self._conversations.forget(session_id)

    # -- before anything is sent ------------------------------------------------
    async def admit(self, session: SessionInfo) -> None:
        """Hold a new turn while its run is paused (a weight sync); 429 past the bound."""
        if self._gate is not None:
            await self._gate.wait(session.spec.run_id)

    async def prepare(self, session: SessionInfo, request: ChatRequest) -> PreparedTurn:
        """Plan the prompt ids with the ledger; nothing is sent or recorded yet."""
        started = time.perf_counter()
        check_conversation(request)
        spec = session.spec
        # The tightest of LEGO_CONTEXT_LENGTH and what every backend worker accepts.
        limits = self._backend.limits
        prompt_budget = limits.max_prompt_tokens
        if spec.max_prompt_tokens is not None:
            prompt_budget = min(prompt_budget, spec.max_prompt_tokens)
        plan = await self._plan(session, request, prompt_budget)
        if _may_be_stale(plan, request) or self._ledger.was_dropped(session.id):
            plan = await self._replan_if_stale(session, request, plan, prompt_budget)
        prompt = plan.prompt_ids
        if len(prompt) > prompt_budget:
            raise ContextLengthExceeded(
                f"the prompt is {len(prompt)} tokens, over this session's budget of "
                f"{prompt_budget} tokens",
                param="messages",
                prompt_tokens=len(prompt),
                limit=prompt_budget,
            )
        sampling = _sampling_params(
            request, session, self._settings.default_max_tokens, limits.output_budget(len(prompt))
        )
        chunk_tokens = self._settings.unstreamed_chunk_tokens
        if not request.stream and chunk_tokens > 1:
            # Nobody watches this answer token by token: fewer, larger chunks to read. SGLang
            # still sends the first token at once (its time to first token is kept) and every
            # token sampled before a pause-abort in the abort's chunk.
            sampling["stream_interval"] = chunk_tokens
        return PreparedTurn(
            turn_id=uuid.uuid4().hex,
            session=session,
            request=request,
            plan=plan,
            prompt_ids=prompt,
            sampling_params=sampling,
            starts_in_reasoning=self._ends_in_think(prompt[-4:]),
            received_at=time.time(),
            started=started,
        )

    def _ends_in_think(self, tail: Sequence[int]) -> bool:
        """The prompt's last tokens end in ``<think>`` (trailing whitespace aside): the
        template opened the answer's reasoning. Prompts end in few distinct tails (the
        template's generation prompt), so each is decoded once, not on every turn."""
        key = tuple(tail)
        known = self._think_tails.get(key)
        if known is None:
            text = str(self._tokenizer.decode(list(key), skip_special_tokens=False))
            known = text.rstrip().endswith("<think>")
            if len(self._think_tails) >= _THINK_TAILS:
                self._think_tails.clear()  # not a template's tails: keep memory bounded
            self._think_tails[key] = known
        return known

    async def _plan(self, session: SessionInfo, request: ChatRequest, budget: int) -> PromptPlan:
        # Rendering a large request runs off the event loop (proxy.ledger.book).
        return await self._ledger.plan_off_loop(session.id, request, max_prompt_tokens=budget)

    async def _replan_if_stale(
        self, session: SessionInfo, request: ChatRequest, plan: PromptPlan, budget: int
    ) -> PromptPlan:
        """Rebuild the session's ledger from the database when it missed recorded turns.

        A restarted proxy, or a replica that did not serve the turn a request continues,
        would otherwise fork (or start a new root) where the request is a plain extend.
        Another replica's newest turn may still be in its write queue, so a fork is checked
        again briefly. The database is never waited on for more than a second per check:
        when it is slow or down the plan stands, and the departure is recorded as such.
        """
        for attempt in range(_STALE_CHECKS):
            try:
                recorded = await asyncio.wait_for(
                    self._store.count_completed_turns(session.id), _DB_WAIT_S
                )
                if recorded > self._ledger.size(session.id):
                    turns = await asyncio.wait_for(self._store.list_turns(session.id), _DB_WAIT_S)
                    requests = recorded_requests(session.id, turns)
                    self._ledger.load(session.id, turns, requests)
                    self._conversations.load(session.id, turns, requests)
                    self._metrics.ledger_reloads.labels(outcome="reloaded").inc()
                    plan = await self._plan(session, request, budget)
                    if not _may_be_stale(plan, request):
                        return plan
            except (TimeoutError, LegoError):
                # Deliberately swallowed: inference goes on without the database.
                self._metrics.ledger_reloads.labels(outcome="database_unavailable").inc()
                return plan
            if not _continues_history(plan, request) or attempt + 1 == _STALE_CHECKS:
                return plan
            await asyncio.sleep(_STALE_RECHECK_S)
        return plan

    # -- the turn -------------------------------------------------------------
    async def run(self, turn: PreparedTurn) -> AsyncGenerator[OutputEvent, None]:
        request = turn.request
        draft = _Draft(self, turn)
        # Built in the loop's pass after the engine's request is written (the generation's
        # first wait), while the engine works: none of it is on the answer's path then.
        asyncio.get_running_loop().call_soon(draft.fill)
        progress = _Progress()
        status = TurnStatus.FAILED
        error: str | None = None
        recorded = False
        self._running[turn.turn_id] = progress
        try:
            async for delta in self._generate(turn, progress):
                parser = draft.parser
                events = parser.feed(delta.ids)
                if events and progress.first_token_s is None:
                    progress.first_token_s = time.perf_counter() - turn.started
                for event in events:
                    progress.message.add(event)
                    yield event
            self._running.pop(turn.turn_id, None)  # past its generation: not abandoned now
            if progress.abandoned:
                # Nobody takes this answer: recorded cancelled (below), with all it sampled.
                status = TurnStatus.CANCELLED
                return
            end = progress.end
            assert end is not None  # _generate returns only after GenerationEnd
            parser = draft.parser
            matched = end.finish.matched if isinstance(end.finish.matched, str) else None
            for event in parser.finish(matched):
                progress.message.add(event)
                yield event
            finished = TurnFinished(
                turn_id=turn.turn_id,
                finish_reason=_finish_reason(end.finish, parser.has_tool_calls),
                usage=Usage(
                    prompt_tokens=len(turn.prompt_ids),
                    completion_tokens=len(progress.output_ids),
                    reasoning_tokens=parser.reasoning_tokens,
                ),
                matched_stop=matched,
            )
            status = TurnStatus.COMPLETED
            answer = progress.message.canonical()
            committed = self._ledger.commit(
                turn.session.id, turn.plan, request, progress.output_ids, answer, turn.turn_id
            )
            # Durable (journal fsync) before the harness sees the end of its answer, so that
            # no crash can fall between a completed response and its record. Shielded: a
            # disconnect now must not leave the turn half-submitted. The record says what
            # the ledger committed (a root that raced another first turn may be settled).
            record = self._record(turn, committed, progress, draft, status, error, answer)
            recorded = True
            self._conversations.commit(
                turn.session.id,
                turn.turn_id,
                committed.parent_turn_id,
                record.messages_inherited,
                request,
                answer,
            )
            # A turn alone in flight is written at once (SQLite on the loop: no task) or
            # by its own task (awaiting the database, no hand-off to the writer's). While
            # others generate, it waits for its batch, so turns that end together share
            # one commit's fsync.
            alone = not self._running
            durability = self._writer.record_now(record) if alone else None
            if durability is None:
                durability = await asyncio.shield(self._writer.submit_durable(record, alone=alone))
            if durability is Durability.LATE:
                # Another replica finished the session while this turn ran: the turn is
                # recorded failed, and the harness must not take it as answered.
                raise Conflict(
                    f"session {turn.session.id} was finished while this turn ran; the "
                    "turn is recorded as failed"
                )
            yield finished
        except (asyncio.CancelledError, GeneratorExit):
            if not recorded:
                status = TurnStatus.CANCELLED
                if not progress.abandoned:
                    self._metrics.backend_aborts.labels(cause="client_disconnect").inc()
                # SGLang ignores a rid it does not hold: abort the call in flight (again,
                # when an abandoned turn's abort did not end it in time).
                self._spawn(self._backend.abort(progress.rid or turn.turn_id))
            raise
        except LegoError as exc:
            error = exc.message
            kind = "backend" if isinstance(exc, BackendError) else exc.code
            self._metrics.backend_errors.labels(kind=kind).inc()
            raise
        except Exception as exc:
            error = f"internal error: {exc!r}"
            raise
        finally:
            self._running.pop(turn.turn_id, None)
            # Every turn that got this far is recorded, failures included, so that nothing
            # the harness saw (or failed to see) goes missing from the trajectory.
            if not recorded:
                self._writer.submit(self._record(turn, turn.plan, progress, draft, status, error))

    async def _generate(
        self, turn: PreparedTurn, progress: _Progress
    ) -> AsyncIterator[GenerationDelta]:
        max_new = int(turn.sampling_params["max_new_tokens"])  # type: ignore[call-overload]
        while True:
            sampling = dict(turn.sampling_params)
            sampling["max_new_tokens"] = max_new - len(progress.output_ids)
            progress.rid = (
                turn.turn_id
                if progress.resumptions == 0
                else f"{turn.turn_id}-r{progress.resumptions}"
            )
            call = GenerateCall(
                input_ids=turn.prompt_ids + tuple(progress.output_ids),
                sampling_params=sampling,
                rid=progress.rid,
                routing_key=turn.session.id,
                routed_experts_start_len=_experts_start(turn.plan)
                if self._settings.return_routed_experts
                else None,
            )
            began = time.perf_counter()
            first = len(progress.output_ids)
            try:
                async for item in self._backend.generate(call):
                    if isinstance(item, GenerationEnd):
                        progress.end = item
                    else:
                        progress.output_ids.extend(item.ids)
                        progress.logprobs.extend(item.logprobs)
                        yield item
            finally:
                progress.backend_s += time.perf_counter() - began
            end = progress.end
            assert end is not None
            # SGLang's spans when a weight update landed inside this call (a retract or
            # in-place pause); one span per call otherwise.
            spans = end.weight_version_spans or (
                (end.weight_version, 0, len(progress.output_ids) - first),
            )
            progress.spans.extend((v, first + a, first + b) for v, a, b in spans)
            remaining = max_new - len(progress.output_ids)
            if end.finish.type != "abort" or remaining <= 0 or progress.abandoned:
                return
            if progress.resumptions >= self._settings.max_resumptions:
                raise BackendError(
                    f"the backend aborted the generation {progress.resumptions + 1} times: "
                    f"{end.finish.message}"
                )
            # A pause or weight update aborted us mid-answer: continue from what was sampled.
            self._metrics.backend_aborts.labels(cause="backend_pause").inc()
            progress.resumptions += 1
            progress.end = None

    # -- recording -------------------------------------------------------------
    def _record(
        self,
        turn: PreparedTurn,
        plan: PromptPlan,
        progress: _Progress,
        draft: _Draft,
        status: TurnStatus,
        error: str | None,
        answer: Message | None = None,
    ) -> TurnRecord:
        """The turn's record, counted in the metrics (a completed turn's just after the
        caller's step, as its answer goes out); the caller hands it to the writer.
        ``plan`` is what the ledger committed (a root that raced another first turn may be
        settled), else the turn's own; ``answer`` the parsed answer when already built."""
        end = progress.end
        now = time.perf_counter() - turn.started
        if answer is None:
            answer = progress.message.canonical()
        routed: RoutedExperts | None = end.routed_experts if end is not None else None
        # Only what the request adds to its parent's conversation (linear storage).
        encoded = draft.encoded(plan.parent_turn_id)
        parser = draft.parser
        record = TurnRecord(
            id=turn.turn_id,
            session_id=turn.session.id,
            seq=int(turn.received_at * 1e6),
            adapter=turn.request.adapter,
            requested_model=turn.request.model,
            status=status,
            prompt_ids=turn.prompt_ids,
            output_ids=tuple(progress.output_ids),
            logprobs=tuple(progress.logprobs),
            routed_experts=routed,
            finish_reason=end.finish.type if end is not None else "error",
            weight_version=end.weight_version if end is not None else "",
            sampling_params=turn.sampling_params,
            request_messages=encoded.data,
            messages_inherited=encoded.inherited,
            response_message=answer_of(answer).encode(),
            ignored_fields=turn.request.ignored_fields,
            malformed_tool_calls=parser.malformed_tool_calls,
            resumptions=progress.resumptions,
            error=error,
            parent_turn_id=plan.parent_turn_id,
            classification=plan.classification.value,
            fork_reason=plan.fork_reason.value if plan.fork_reason else None,
            reused_prefix_len=plan.reused_prefix_len,
            side_requests=plan.side_requests,
            weight_version_spans=_straddled(progress.spans),
            timings=TurnTimings(
                received_at=turn.received_at,
                first_token_s=progress.first_token_s,
                finished_s=now,
                backend_s=progress.backend_s,
            ),
        )
        if status is TurnStatus.COMPLETED:
            # Counted once the answer is on its way: the counting is none of its latency.
            asyncio.get_running_loop().call_soon(self._count, record)
        else:
            self._count(record)
        return record

    def _count(self, record: TurnRecord) -> None:
        """The turn in the metrics (``_record``'s, for the record it built)."""
        adapter = record.adapter
        timings = record.timings
        metrics = self._metrics
        metrics.child(
            metrics.ledger,
            classification=record.classification,
            reason=record.fork_reason or "none",
        ).inc()
        for _ in record.side_requests:
            # Counted as roots when they arrived; now they count as what they were.
            metrics.child(metrics.ledger, classification="fork", reason="side_request").inc()
            metrics.child(
                metrics.ledger_relabels, was="root", classification="fork", reason="side_request"
            ).inc()
        metrics.child(metrics.turns, adapter=adapter, status=record.status.value).inc()
        finished_s = timings.finished_s or 0.0  # the pipeline's records always carry both
        metrics.child(metrics.turn_duration, adapter=adapter).observe(finished_s)
        metrics.child(metrics.added_latency, adapter=adapter).observe(
            max(0.0, finished_s - (timings.backend_s or 0.0))
        )
        if timings.first_token_s is not None:
            metrics.child(metrics.ttft, adapter=adapter).observe(timings.first_token_s)
        metrics.prompt_tokens.inc(len(record.prompt_ids))
        metrics.completion_tokens.inc(len(record.output_ids))
        if record.malformed_tool_calls:
            metrics.malformed_tool_calls.inc(record.malformed_tool_calls)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


# Forks that are new conversations by nature; a stale ledger cannot be why they fork.
_FRESH_FORKS = (ForkReason.SIDE_REQUEST, ForkReason.SUBAGENT)
_STALE_CHECKS = 3
_STALE_RECHECK_S = 0.1
_DB_WAIT_S = 1.0
_THINK_TAILS = 256  # distinct prompt tails remembered (a template has a handful)


def _may_be_stale(plan: PromptPlan, request: ChatRequest) -> bool:
    """A root or a fork may only mean this process has not seen the session's turns.

    A root whose request carries no assistant message cannot continue anything, so it
    needs no look at the database (the first turn of every session)."""
    if plan.classification is Classification.ROOT:
        return _continues_history(plan, request)
    return plan.classification is Classification.FORK and plan.fork_reason not in _FRESH_FORKS


def _continues_history(plan: PromptPlan, request: ChatRequest) -> bool:
    """Worth re-checking: the request carries answers the ledger should know by now."""
    if plan.classification is Classification.FORK:
        return True
    return any(message.role == "assistant" for message in request.messages)


def _experts_start(plan: PromptPlan) -> int:
    """First row to fetch: earlier rows of a continuation are held by the turns it extends.

    The parent's last sampled token was never fed through the model in the parent's turn,
    so its row comes with this one. A fork starts a new training sequence: all rows.
    """
    if plan.classification in (Classification.EXTEND, Classification.REALIGN):
        return max(0, plan.reused_prefix_len - 1)
    return 0


def _finish_reason(finish: Finish, has_tool_calls: bool) -> FinishReason:
    if finish.type == "length":
        return FinishReason.LENGTH
    if has_tool_calls:
        return FinishReason.TOOL_CALLS
    return FinishReason.STOP


def _straddled(spans: list[tuple[str, int, int]]) -> tuple[tuple[str, int, int], ...]:
    """The turn's weight-version spans, or () when one version sampled all of it (the
    record's ``weight_version`` says which). Empty spans are dropped and adjacent spans
    of one version merged (a resumption under the same weights)."""
    out: list[tuple[str, int, int]] = []
    for version, start, end in spans:
        if out and out[-1][0] == version and out[-1][2] == start:
            out[-1] = (version, out[-1][1], end)
        elif end > start:
            out.append((version, start, end))
    return tuple(out) if len({version for version, _, _ in out}) > 1 else ()


def _sampling_params(
    request: ChatRequest, session: SessionInfo, default_max_tokens: int, output_budget: int
) -> dict[str, object]:
    """SGLang's own keys only (unknown keys are a 400 there); session pins win."""
    asked = request.sampling
    params: dict[str, object] = {
        # Decode and trim nothing on the backend: the proxy parses the exact ids itself.
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }
    wanted: dict[str, object | None] = {
        "temperature": asked.temperature,
        "top_p": asked.top_p,
        "top_k": asked.top_k,
        "sampling_seed": asked.seed,
        "max_new_tokens": asked.max_tokens,
    }
    for key, sglang_key in SESSION_SAMPLING_KEYS.items():
        pinned = session.spec.sampling.get(key)
        if pinned is not None:
            wanted[sglang_key] = pinned
    for key, value in wanted.items():
        if value is not None:
            params[key] = value
    if asked.stop:
        params["stop"] = list(asked.stop)
    budget = output_budget
    if session.spec.max_output_tokens is not None:
        budget = min(budget, session.spec.max_output_tokens)
    requested = params.get("max_new_tokens", default_max_tokens)
    assert isinstance(requested, int)
    params["max_new_tokens"] = max(1, min(requested, budget))
    return params
