"""The served model's tokenizer and chat template, checked and understood once at start-up.

Owns ``served_template(path, tool_parser) -> ServedTemplate``: it loads the tokenizer at
``path``, runs the ledger's self-check on its chat template
(``proxy.ledger.template_check``) and decides the tool-call format the output parser reads:

- ``tool_parser`` when the operator set one (``LEGO_TOOL_PARSER``);
- otherwise the format the template itself writes for an assistant's tool call: XML
  (``<function=NAME>``, Qwen3-Coder and Qwen3.5) is ``qwen3_coder``, JSON
  (``{"name": "NAME"``, Qwen2.5 and Qwen3) is ``qwen3``;
- ``qwen3`` for a template that writes neither (one without tool support), which
  ``tool_parser_source`` says.

Errors: ``LegoError`` with one line for an operator (a directory that holds no tokenizer, a
template the ledger cannot render incrementally), raised before anything is served.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from kernel.errors import InvalidRequest
from proxy.canonical import ChatRequest, Message, ToolCall, ToolSpec
from proxy.ledger.incremental import IncrementalRenderer
from proxy.ledger.template_check import check_template
from proxy.render import Renderer, load_tokenizer
from proxy.settings import ToolParser

_NAME = "lego_format_probe"
_PROBE = ChatRequest(
    adapter="startup",
    model="",
    messages=(
        Message(role="user", content="Call the tool."),
        Message(
            role="assistant",
            content="",
            tool_calls=(ToolCall(id="c0", name=_NAME, arguments='{"path": "a.txt"}'),),
        ),
    ),
    tools=(
        ToolSpec(
            name=_NAME,
            description="Probe.",
            parameters={"type": "object", "properties": {"path": {"type": "string"}}},
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class ServedTemplate:
    tokenizer: PreTrainedTokenizerBase
    tool_parser: ToolParser
    tool_parser_source: str  # why this format: "LEGO_TOOL_PARSER", "the chat template", ...


def served_template(path: Path, tool_parser: ToolParser | None) -> ServedTemplate:
    tokenizer = load_tokenizer(path)
    check_template(tokenizer, IncrementalRenderer(tokenizer))
    if tool_parser is not None:
        return ServedTemplate(tokenizer, tool_parser, "LEGO_TOOL_PARSER")
    written = template_tool_parser(tokenizer)
    if written is None:
        source = "default: the chat template writes no tool call this parser knows"
        return ServedTemplate(tokenizer, ToolParser.QWEN3, source)
    return ServedTemplate(tokenizer, written, "the chat template")


def template_tool_parser(tokenizer: PreTrainedTokenizerBase) -> ToolParser | None:
    """The tool-call format the chat template writes, or None when it writes neither."""
    try:
        text = Renderer(tokenizer).render_text(_PROBE, generation_prompt=False)
    except InvalidRequest:
        return None  # a template that cannot render a tool call at all
    if f"<function={_NAME}>" in text:
        return ToolParser.QWEN3_CODER
    if f'"name": "{_NAME}"' in text:
        return ToolParser.QWEN3
    return None
