"""SGLang's own output parsers, imported without SGLang's runtime, for differential tests.

Owns ``sglang_parsers() -> SGLangParsers``: the ``Qwen25Detector`` and
``Qwen3CoderDetector`` tool-call detectors and the ``Qwen3Detector`` reasoning detector of
the installed ``sglang`` package (pinned to 0.5.23 and installed ``--no-deps`` by ``make
install``, with only what these modules import: see ``pyproject.toml``), plus SGLang's
``Tool`` model, imported without SGLang's runtime (``tests.support.sglang_package``).

``parse_non_stream`` and ``parse_stream`` do what SGLang's ``FunctionCallParser`` and
``ReasoningParser`` do around the detectors (that module itself imports xgrammar): split
reasoning first (``--reasoning-parser qwen3``), then tool calls from the rest
(``--tool-call-parser qwen25|qwen3_coder``), whole or chunk by chunk.

``SGLangUnavailable`` says why the modules cannot be imported; the tests skip on it outside
CI and fail under CI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical import ToolSpec
from proxy.settings import ToolParser
from tests.support.sglang_package import import_sglang


@dataclass(frozen=True)
class SGLangResult:
    reasoning: str
    content: str
    calls: tuple[tuple[str, str], ...]  # (name, arguments JSON text)


@dataclass(frozen=True)
class SGLangParsers:
    modules: dict[str, Any]

    def _tools(self, tools: Sequence[ToolSpec]) -> list[Any]:
        tool = self.modules["protocol"].Tool
        return [
            tool(
                type="function",
                function={"name": t.name, "description": t.description, "parameters": t.parameters},
            )
            for t in tools
        ]

    def _detector(self, parser: ToolParser) -> Any:
        if parser is ToolParser.QWEN3_CODER:
            return self.modules["qwen3_coder"].Qwen3CoderDetector()
        return self.modules["qwen25"].Qwen25Detector()

    def parse_non_stream(
        self, parser: ToolParser, text: str, tools: Sequence[ToolSpec], *, in_reasoning: bool
    ) -> SGLangResult:
        thinking = self.modules["reasoning"].Qwen3Detector(force_reasoning=in_reasoning)
        split = thinking.detect_and_parse(text)
        normal = split.normal_text
        sg_tools = self._tools(tools)
        detector = self._detector(parser)
        result = detector.detect_and_parse(normal, sg_tools)
        if result.calls or detector.has_tool_call(normal):
            calls = tuple((c.name, c.parameters) for c in result.calls)
            return SGLangResult(split.reasoning_text, result.normal_text, calls)
        return SGLangResult(split.reasoning_text, normal, ())

    def parse_stream(
        self,
        parser: ToolParser,
        chunks: Sequence[str],
        tools: Sequence[ToolSpec],
        *,
        in_reasoning: bool,
    ) -> SGLangResult:
        thinking = self.modules["reasoning"].Qwen3Detector(force_reasoning=in_reasoning)
        detector = self._detector(parser)
        sg_tools = self._tools(tools)
        reasoning: list[str] = []
        content: list[str] = []
        names: dict[int, str] = {}
        arguments: dict[int, str] = {}

        def tool_chunk(text: str) -> None:
            result = detector.parse_streaming_increment(text, sg_tools)
            content.append(result.normal_text)
            for item in result.calls:
                if item.name:
                    names[item.tool_index] = item.name
                arguments[item.tool_index] = arguments.get(item.tool_index, "") + (
                    item.parameters or ""
                )

        for chunk in chunks:
            split = thinking.parse_streaming_increment(chunk)
            reasoning.append(split.reasoning_text)
            if split.normal_text:
                tool_chunk(split.normal_text)
        end = thinking.finish()
        reasoning.append(end.reasoning_text)
        if end.normal_text:
            tool_chunk(end.normal_text)
        final = detector.finish(sg_tools)
        content.append(final.normal_text)
        calls = tuple((names[i], arguments.get(i, "")) for i in sorted(names))
        return SGLangResult("".join(reasoning), "".join(content), calls)


def sglang_parsers() -> SGLangParsers:
    names = {
        "protocol": "sglang.srt.entrypoints.openai.protocol",
        "qwen25": "sglang.srt.function_call.qwen25_detector",
        "qwen3_coder": "sglang.srt.function_call.qwen3_coder_detector",
        "reasoning": "sglang.srt.parser.reasoning_parser",
    }
    return SGLangParsers(dict(zip(names, import_sglang(*names.values()), strict=True)))
