"""The tiny model's chat template: Qwen3's prompt format, written here in Jinja.

Owns ``CHAT_TEMPLATE``, saved as the tokenizer's ``chat_template`` so that
``AutoTokenizer.from_pretrained(dir).apply_chat_template(...)`` renders exactly what a real
Qwen3 checkpoint would:

- ChatML turns ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; list content is the text of
  its parts joined together.
- With ``tools``, the system turn carries the tool specs in a ``<tools>`` block (one
  ``tojson`` line each) and Qwen3's instruction on the ``<tool_call>`` answer format.
- Assistant tool calls become ``<tool_call>\\n{"name": "N", "arguments": A}\\n</tool_call>``
  (A verbatim when it is a string, else ``tojson``), joined by newlines.
- Consecutive ``tool`` messages share one ``user`` turn of ``<tool_response>`` blocks.
- Assistant reasoning (``reasoning_content``, or a ``</think>`` inside content) is kept as
  ``<think>\\n...\\n</think>\\n\\n`` only after the last real user query; earlier reasoning
  is dropped, as Qwen3 does.
- ``add_generation_prompt`` opens an assistant turn; ``enable_thinking=false`` pre-fills
  an empty think block.
"""

from __future__ import annotations

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# Jinja string literals cannot hold raw newlines portably, so the two long texts are
# spliced in with their newlines escaped.
_PRE = TOOLS_PREAMBLE.replace("\n", "\\n")
_POST = TOOLS_POSTAMBLE.replace("\n", "\\n").replace('"', '\\"')

CHAT_TEMPLATE = (
    """
{%- macro text_of(content) -%}
  {%- if content is string -%}{{ content }}
  {%- elif content is iterable and content is not mapping -%}
    {%- for part in content -%}
      {%- if part is string -%}{{ part }}
      {%- elif part.text is defined and part.text is string -%}{{ part.text }}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if has_system -%}{{- text_of(messages[0].content) + '\\n\\n' -}}{%- endif -%}
  {{- "@PRE@" -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- "@POST@" + '<|im_end|>\\n' -}}
{%- elif has_system -%}
  {{- '<|im_start|>system\\n' + text_of(messages[0].content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- set state = namespace(last_query=-1) -%}
{%- for message in messages -%}
  {%- if message.role == 'user' -%}
    {%- set text = text_of(message.content) -%}
    {%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) -%}
      {%- set state.last_query = loop.index0 -%}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- set text = text_of(message.content) -%}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + message.role + '\\n' + text + '<|im_end|>\\n' -}}
  {%- elif message.role == 'assistant' -%}
    {%- set reasoning = '' -%}
    {%- if message.reasoning_content is defined and message.reasoning_content is string -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif '</think>' in text -%}
      {%- set reasoning = text.split('</think>')[0].split('<think>')[-1] -%}
      {%- set text = text.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if loop.index0 > state.last_query and reasoning.strip('\\n') -%}
      {{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + text.lstrip('\\n') -}}
    {%- else -%}
      {{- text -}}
    {%- endif -%}
    {%- if message.tool_calls is defined and message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- if not loop.first or text -%}{{- '\\n' -}}{%- endif -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {{- '<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' -}}
        {%- if fn.arguments is string -%}{{- fn.arguments -}}
        {%- else -%}{{- fn.arguments | tojson -}}
        {%- endif -%}
        {{- '}\\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
      {{- '<|im_end|>\\n' -}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\\n\\n</think>\\n\\n' -}}
  {%- endif -%}
{%- endif -%}
""".strip()
    .replace("@PRE@", _PRE)
    .replace("@POST@", _POST)
)
