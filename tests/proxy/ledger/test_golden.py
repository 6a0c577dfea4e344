"""Golden multi-turn sessions modelled on real harnesses' habits (reference/harnesses.md).

Every turn asserts, through ``Driver``, that an extend's prompt starts with the parent's
exact prompt + sampled ids; each test asserts the classification sequence.
"""

from __future__ import annotations

import json

from transformers import PreTrainedTokenizerBase

from proxy.canonical import Message, ToolChoice, ToolChoiceMode
from proxy.ledger import LedgerBook
from proxy.render import Renderer
from tests.proxy.ledger.conftest import (
    BASH,
    READ,
    SYSTEM,
    Driver,
    call,
    request,
    sampled,
)

USER = Message(role="user", content="Create out.txt containing hello.")
A1 = Message(
    role="assistant",
    content="",
    reasoning="I will use the shell.",
    tool_calls=(call("bash", '{"command":"echo hello > out.txt","timeout":30}'),),
)
T1 = Message(role="tool", content="(no output)", tool_call_id="call_1")
A2 = Message(role="assistant", content="Done: out.txt contains hello.", reasoning="It ran.")
USER2 = Message(role="user", content="Now show it.")
A3 = Message(role="assistant", content="", tool_calls=(call("read", '{"path": "out.txt"}'),))
T3 = Message(role="tool", content="hello", tool_call_id="call_1")


def classifications(driver: Driver) -> list[str]:
    return [
        plan.classification + (f":{plan.fork_reason}" if plan.fork_reason else "")
        for plan in driver.plans
    ]


def test_openai_sdk_tool_loop_echoing_the_message(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    d.turn(request(SYSTEM, USER, A1, T1), A2)
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2), A3)
    last = d.turn(request(SYSTEM, USER, A1, T1, A2, USER2, A3, T3), A2)
    assert classifications(d) == ["root", "extend", "extend", "extend"]
    assert last.new_message_count == 1


def test_litellm_reencodes_arguments_drops_reasoning_and_reorders_tools(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    # Python json.dumps: ", "/": " spacing, other key order; no reasoning, no content key.
    arguments = json.dumps({"timeout": 30, "command": "echo hello > out.txt"})
    echoed = Message(
        role="assistant", content="", tool_calls=(call("bash", arguments, "toolu_other"),)
    )
    tool = Message(role="tool", content="(no output)", tool_call_id="toolu_other", name="bash")
    d.turn(request(SYSTEM, USER, echoed, tool, tools=(READ, BASH)), A2)
    echoed2 = Message(role="assistant", content="  Done: out.txt contains hello.\n")
    d.turn(request(SYSTEM, USER, echoed, tool, echoed2, USER2, tools=(READ, BASH)), A3)
    assert classifications(d) == ["root", "extend", "extend"]


def test_opencode_echoes_reasoning_and_its_title_request_is_a_side_request(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    title_system = Message(role="system", content="You are a title generator.")
    d.turn(request(title_system, USER, tools=()), Message(role="assistant", content="Hello file"))
    echoed = Message(
        role="assistant",
        content="",
        reasoning="I will use the shell.",
        tool_calls=(call("bash", '{"command":"echo hello > out.txt","timeout":30}', "x"),),
    )
    main = d.turn(request(SYSTEM, USER, echoed, T1), A2)
    assert classifications(d) == ["root", "fork:side_request", "extend"]
    assert main.parent_turn_id == next(iter(d.tokens))


def test_compaction_forks_and_the_compacted_branch_then_extends(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    d.turn(request(SYSTEM, USER, A1, T1), A2)
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2), A3)
    # OpenCode: [user "What did we do so far?", assistant summary, user "Continue..."].
    summary = Message(role="assistant", content="We created out.txt.")
    ask = Message(role="user", content="What did we do so far?")
    go_on = Message(role="user", content="Continue if you have next steps.")
    fork = d.turn(request(SYSTEM, ask, summary, go_on), A3)
    d.turn(request(SYSTEM, ask, summary, go_on, A3, T3), A2)
    # Claude Code: the history becomes one summary user message.
    d.turn(request(SYSTEM, Message(role="user", content="Continued session: summary")), A2)
    assert classifications(d) == [
        "root",
        "extend",
        "extend",
        "fork:compaction",
        "extend",
        "fork:compaction",
    ]
    system_prefix = Renderer(tokenizer).render(request(SYSTEM))
    assert fork.reused_prefix_len >= len(system_prefix) - 3  # the system turn is reused


def test_subagent_between_main_turns_does_not_end_the_main_branch(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    sub_system = Message(role="system", content="You are a search sub-agent.")
    sub_user = Message(role="user", content="Find every txt file.")
    d.turn(request(sub_system, sub_user, tools=(READ,)), A3)
    d.turn(request(sub_system, sub_user, A3, T3, tools=(READ,)), A2)
    d.turn(request(SYSTEM, USER, A1, T1), A2)
    assert classifications(d) == ["root", "fork:subagent", "extend", "extend"]
    assert d.plans[3].parent_turn_id == next(iter(d.tokens))


def test_a_retry_of_the_same_turn_gets_the_same_prompt(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    first = d.turn(request(SYSTEM, USER), A1)
    again = d.turn(request(SYSTEM, USER), A1)
    second = d.turn(request(SYSTEM, USER, A1, T1), A2)
    retried = book.plan(d.session_id, request(SYSTEM, USER, A1, T1))
    assert again.prompt_ids == first.prompt_ids
    assert again.classification == "root"
    assert retried.prompt_ids == second.prompt_ids
    assert retried.classification == "extend"
    assert retried.parent_turn_id == second.parent_turn_id


def test_edits_and_context_changes_fork_with_their_reason(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    d.turn(request(SYSTEM, USER, A1, T1), A2)
    pruned = Message(role="tool", content="[old output pruned]", tool_call_id="call_1")
    d.turn(request(SYSTEM, USER, A1, pruned, A2, USER2), A3)
    other_system = Message(role="system", content="You are a careful coding agent.")
    d.turn(request(other_system, USER, A1, T1, A2, USER2), A3)
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2, tools=(BASH,)), A3)
    forbidden = ToolChoice(mode=ToolChoiceMode.NONE)
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2, tool_choice=forbidden), A2)
    assert classifications(d) == [
        "root",
        "extend",
        "fork:edited_history",
        "fork:system_changed",
        "fork:tools_changed",
        "fork:side_request",
    ]


def test_an_answer_cut_by_the_length_limit_is_realigned(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    cut = Message(role="assistant", content="Here is the start of a long")
    d.turn(request(SYSTEM, USER), cut, output=sampled(tokenizer, cut, eos=False))
    plan = d.turn(request(SYSTEM, USER, cut, USER2), A2)
    assert plan.classification == "realign"
    assert tokenizer.eos_token_id is not None
    assert plan.prompt_ids[plan.reused_prefix_len] == tokenizer.eos_token_id
    whole = Renderer(tokenizer).render(request(SYSTEM, USER, cut, USER2))
    assert list(plan.prompt_ids) == whole  # canonical sampling: the repair is exact


def test_a_harness_that_drops_trailing_text_still_extends(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    long = Message(role="assistant", content="Done. Anything else I can do for you today?")
    d.turn(request(SYSTEM, USER), long)
    trimmed = Message(role="assistant", content="Done.")
    assert d.turn(request(SYSTEM, USER, trimmed, USER2), A3).classification == "extend"


def test_dropping_reasoning_like_the_template_forks_per_user_query(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    d = Driver(LedgerBook(tokenizer, keep_reasoning=False), tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    d.turn(request(SYSTEM, USER, A1, T1), A2)
    asked = request(SYSTEM, USER, A1, T1, A2, USER2)
    plan = d.turn(asked, A3)
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2, A3, T3), A2)
    assert classifications(d) == ["root", "extend", "fork:reasoning_dropped", "extend"]
    assert list(plan.prompt_ids) == Renderer(tokenizer).render(asked)
    assert plan.parent_turn_id == list(d.tokens)[1]
    assert 0 < plan.reused_prefix_len < len(d.tokens[plan.parent_turn_id])


def test_the_default_policy_keeps_reasoning_across_user_queries(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    d.turn(request(SYSTEM, USER, A1, T1), A2)
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2), A3)
    assert classifications(d) == ["root", "extend", "extend"]
    assert tokenizer.convert_tokens_to_ids("<think>") in d.plans[2].prompt_ids


# Claude Code 2.x, as captured on the wire around `claude -p /compact --continue` (the
# request shapes, with the long texts shortened): in-array system messages, the agent list
# after the first user message, the skills list at the end of the next run.
CC_USER = Message(role="user", content="<system-reminder>date</system-reminder>\n\nLEGO-TASK")
CC_AGENTS = Message(role="system", content="Available agent types for the Agent tool: ...")
CC_A1 = Message(
    role="assistant",
    content="",
    reasoning="The task needs a file.",
    tool_calls=(call("bash", '{"command":"echo hi > out.txt","timeout":30}', "toolu_1"),),
)
CC_T1 = Message(role="tool", content="(Bash completed with no output)", tool_call_id="toolu_1")
CC_A2 = Message(role="assistant", content="Done: out.txt is written.", reasoning="It ran.")
CC_COMPACT = Message(role="user", content="CRITICAL: Respond with TEXT ONLY. ... summary")
CC_SUMMARY = Message(role="assistant", content="Summary: out.txt was written.")


def claude_code_compacted(*, task: str) -> tuple[Message, ...]:
    """The next run's history after /compact: summary, the kept last answer, caveats."""
    return (
        SYSTEM,
        Message(
            role="user",
            content="<system-reminder>date</system-reminder>\n\nThis session is being "
            "continued from a previous conversation that ran out of context.\n\n"
            f"{CC_SUMMARY.content}\n\nContinue the conversation from where it left off.",
        ),
        # The last answer, echoed with its thinking, now right after the summary.
        Message(role="assistant", content=CC_A2.content, reasoning=CC_A2.reasoning),
        Message(role="user", content="<local-command-caveat>...</local-command-caveat> /compact"),
        Message(role="system", content="Available agent types for the Agent tool: ... (v2)"),
        Message(role="assistant", content="No response requested."),  # never sampled
        Message(role="user", content=task),
        Message(role="system", content="The following skills are available: ..."),
    )


def test_claude_code_compact_keeps_its_last_answer_and_is_still_a_compaction(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, CC_USER, CC_AGENTS), CC_A1)
    d.turn(request(SYSTEM, CC_USER, CC_AGENTS, CC_A1, CC_T1), CC_A2)
    # /compact: the same system prompt and tools, the final answer left out, the
    # instruction appended: it continues the first turn token-exactly.
    d.turn(request(SYSTEM, CC_USER, CC_AGENTS, CC_A1, CC_T1, CC_COMPACT), CC_SUMMARY)
    compacted = claude_code_compacted(task="LEGO-TASK-again")
    # Longer than any history of the session: length is no evidence either way.
    assert len(compacted) > 7
    d.turn(request(*compacted), CC_A1)
    d.turn(request(*compacted, CC_A1, CC_T1), CC_A2)
    assert classifications(d) == ["root", "extend", "extend", "fork:compaction", "extend"]
    assert d.plans[3].parent_turn_id == next(iter(d.tokens))  # shares the system prompt


def test_compaction_of_a_long_history_keeping_the_last_exchange(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    d.turn(request(SYSTEM, USER, A1, T1), A2)
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2), A3)
    shown = Message(role="assistant", content="It says hello.")
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2, A3, T3), shown)
    summary = Message(role="user", content="Summary: out.txt was created.")
    more = Message(role="user", content="Now delete it.")
    d.turn(request(SYSTEM, summary, A3, T3, shown, more), A1)  # the last exchange, moved up
    assert classifications(d) == ["root", "extend", "extend", "extend", "fork:compaction"]


def test_edits_keep_the_history_in_place_and_stay_edits(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), A1)
    d.turn(request(SYSTEM, USER, A1, T1), A2)
    d.turn(request(SYSTEM, USER, A1, T1, A2, USER2), A3)
    # The first user message edited, every answer after it where it was.
    edited_first = Message(role="user", content="Create out.txt containing HELLO.")
    d.turn(request(SYSTEM, edited_first, A1, T1, A2, USER2, A3, T3), A2)
    # The model's first answer re-rendered by the harness (not the text it sampled).
    rewritten = Message(role="assistant", content="", tool_calls=(call("bash", '{"x":1}'),))
    d.turn(request(SYSTEM, USER, rewritten, T1), A2)
    # An in-array system message changed (Claude Code's agent list, say).
    d.turn(request(SYSTEM, USER, Message(role="system", content="agents v2"), A1, T1), A2)
    assert classifications(d) == [
        "root",
        "extend",
        "extend",
        "fork:edited_history",
        "fork:edited_history",
        "fork:edited_history",
    ]
