"""What each SGLang worker is configured with, and the limits the proxy keeps to because of it.

Owns ``ServerInfo`` (the fields of SGLang's ``GET /server_info`` the proxy depends on),
``parse_server_info``, ``BackendLimits`` and ``assess``.

Contract:
- ``parse_server_info(url, payload)`` reads SGLang 0.5.23's answer (resolved ``ServerArgs``
  plus scheduler info). ``max_req_input_len`` is required (a prompt must be shorter);
  ``context_length`` may be null (SGLang then uses the model's own), in which case the
  proxy assumes the least context consistent with it: SGLang derives
  ``max_req_input_len = min(context - 1, kv_pool - 1) - 5``, so the context is at least
  ``max_req_input_len + 6``.
- ``BackendLimits`` are the proxy's budgets: ``max_prompt_tokens`` (the longest prompt it
  sends) and ``output_budget(prompt_len)``. Output is bounded twice: prompt plus output
  within the context (SGLang's tokenizer refuses more), and prompt plus all but the last
  output token within ``max_prompt_tokens``, so that a resumption after a pause-abort
  (prompt + partial output) is still a prompt the server accepts.
- ``assess(settings_context, infos, want_experts)`` combines the workers: the limits are the
  tightest of ``LEGO_CONTEXT_LENGTH`` and every worker's; it returns warnings for
  ``LEGO_CONTEXT_LENGTH`` above what a worker accepts and for seeds a worker ignores
  (no ``--enable-deterministic-inference``), and raises ``BackendMisconfigured`` when routed
  experts are expected and a worker runs without ``--enable-return-routed-experts`` (it
  would silently return none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kernel.errors import BackendError, BackendMisconfigured

# SGLang: max_req_input_len = max_req_len - 5 and max_req_len <= context_len - 1.
_CONTEXT_OVER_MAX_INPUT = 6


@dataclass(frozen=True, slots=True)
class ServerInfo:
    url: str
    context_length: int
    max_req_input_len: int
    routed_experts: bool
    incremental_streaming: bool
    deterministic: bool
    weight_version: str | None = None

    def describe(self) -> str:
        """One line for the log: what the proxy learnt about this worker."""
        return (
            f"{self.url}: context {self.context_length}, prompts under "
            f"{self.max_req_input_len} tokens, routed experts "
            f"{'on' if self.routed_experts else 'off'}, "
            f"{'incremental' if self.incremental_streaming else 'cumulative'} streaming, "
            f"seeds {'honoured' if self.deterministic else 'ignored'}, "
            f"weight version {self.weight_version}"
        )


def _int(payload: dict[str, object], key: str, url: str) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BackendError(f"{url}/server_info has a bad {key}: {value!r}", retryable=False)
    return value


def parse_server_info(url: str, payload: object) -> ServerInfo:
    if not isinstance(payload, dict):
        raise BackendError(f"{url}/server_info is not a JSON object", retryable=False)
    max_input = _int(payload, "max_req_input_len", url)
    if max_input is None:
        raise BackendError(f"{url}/server_info has no max_req_input_len", retryable=False)
    context = _int(payload, "context_length", url) or max_input + _CONTEXT_OVER_MAX_INPUT
    version = payload.get("weight_version")
    return ServerInfo(
        url=url,
        context_length=context,
        max_req_input_len=max_input,
        routed_experts=payload.get("enable_return_routed_experts") is True,
        incremental_streaming=payload.get("incremental_streaming_output") is True,
        deterministic=payload.get("enable_deterministic_inference") is True,
        weight_version=version if isinstance(version, str) else None,
    )


@dataclass(frozen=True, slots=True)
class BackendLimits:
    context_length: int  # prompt + output, tokens
    max_prompt_tokens: int  # the longest prompt (or prompt + partial output) sent

    @classmethod
    def of(cls, context_length: int) -> BackendLimits:
        return cls(context_length=context_length, max_prompt_tokens=context_length - 1)

    @classmethod
    def of_server(cls, info: ServerInfo) -> BackendLimits:
        return cls(
            context_length=info.context_length,
            max_prompt_tokens=min(info.context_length, info.max_req_input_len) - 1,
        )

    def tighter(self, other: BackendLimits) -> BackendLimits:
        return BackendLimits(
            min(self.context_length, other.context_length),
            min(self.max_prompt_tokens, other.max_prompt_tokens),
        )

    def output_budget(self, prompt_len: int) -> int:
        return min(self.context_length - prompt_len, self.max_prompt_tokens + 1 - prompt_len)


@dataclass(frozen=True, slots=True)
class Assessment:
    limits: BackendLimits
    warnings: tuple[str, ...]


def assess(settings_context: int, infos: Sequence[ServerInfo], *, want_experts: bool) -> Assessment:
    configured = BackendLimits.of(settings_context)
    limits = configured
    warnings: list[str] = []
    for info in infos:
        if want_experts and not info.routed_experts:
            raise BackendMisconfigured(
                f"{info.url} runs without --enable-return-routed-experts, so it would "
                "return no routed experts for this MoE model: restart it with the flag, "
                "or set LEGO_RETURN_ROUTED_EXPERTS=false to record without them"
            )
        server = BackendLimits.of_server(info)
        if server.max_prompt_tokens < configured.max_prompt_tokens:
            warnings.append(
                f"LEGO_CONTEXT_LENGTH={settings_context} is more than {info.url} accepts "
                f"(context {info.context_length}, prompts under {info.max_req_input_len} "
                f"tokens); the proxy keeps to {server.max_prompt_tokens} prompt tokens"
            )
        if not info.deterministic:
            warnings.append(
                f"{info.url} runs without --enable-deterministic-inference: sampling "
                "seeds (the session's 'seed', a request's 'seed') are ignored"
            )
        limits = limits.tighter(server)
    return Assessment(limits, tuple(warnings))
