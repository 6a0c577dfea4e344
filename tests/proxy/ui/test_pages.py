"""Rendering of the read models' frozen results: sampled ids decoded by the caller's
decoder (and escaped), rewards as the recorder reads them, a vector included."""

from __future__ import annotations

from proxy.ui.pages import Pages
from recorder.read_models.session_view import SampledToken, SessionView, ShownMessage, TurnView
from recorder.read_models.tables import Page, SessionRow

REPLY = ShownMessage("assistant", "Done.", None, (("bash", "{}"),), None)


def session_view(reward: float | tuple[float, ...] | None) -> SessionView:
    turn = TurnView(
        id="t0",
        seq=0,
        number=1,
        parent_number=None,
        depth=0,
        parent_turn_id=None,
        classification="root",
        fork_reason=None,
        status="completed",
        finish_reason="stop",
        weight_version="v0",
        adapter="openai_chat",
        error=None,
        prompt_tokens=3,
        output_tokens=5,
        malformed_tool_calls=0,
        first_token_s=0.01,
        finished_s=0.05,
        backend_s=0.04,
        new_messages=(ShownMessage("user", "Fix it.", None, (), None),),
        reply=REPLY,
        tokens=(SampledToken(100, -0.01), SampledToken(101, -2.5)),
    )
    return SessionView(
        id="s" * 32,
        run_id="r",
        task_id="task",
        group_id="g",
        sample_index=0,
        harness="h",
        status="finished",
        termination="completed",
        reward=reward,
        turns=(turn,),
    )


def session_row(reward: float | tuple[float, ...] | None) -> SessionRow:
    return SessionRow(
        id="s" * 32,
        task_id="task",
        group_id="g",
        sample_index=0,
        status="finished",
        termination="completed",
        reward=reward,
        version="v0",
        turns=1,
        output_tokens=5,
        malformed=0,
    )


def test_the_session_page_decodes_only_the_shown_ids_with_the_callers_decoder() -> None:
    asked: list[int] = []

    def decode(token: int) -> str:
        asked.append(token)
        return f"<{token}>"

    html = Pages().session(session_view(1.0), decode)
    assert asked == [100, 101]
    assert "&lt;100&gt;" in html
    assert "&lt;101&gt;" in html
    assert "… 3 more" in html  # five sampled, two shown
    assert "Fix it." in html
    assert "reward 1," in html


def test_a_vector_reward_renders_as_the_vector() -> None:
    pages = Pages()
    assert "reward [1.0, 0.0]," in pages.session(session_view((1.0, 0.0)), str)
    assert "reward \u2013," in pages.session(session_view(None), str)
    table = pages.sessions("r", Page((session_row((1.0, 0.0)), session_row(0.5)), 2, 1, 50))
    assert '<td class="num">[1.0, 0.0]</td>' in table
    assert '<td class="num">0.5</td>' in table
