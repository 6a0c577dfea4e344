"""The sessions list's query string: what a form sends becomes a filter, what it must not
send is a 400 naming the parameter, and links keep the rest of the query."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from kernel.errors import InvalidRequest
from proxy.ui.queries import SessionsQuery
from recorder.read_models.tables import SessionFilter


def test_a_form_with_blank_fields_is_no_filter() -> None:
    blank = {k: "" for k in ("task", "termination", "purpose", "excluded", "fork", "min_reward")}
    query = SessionsQuery.parse({**blank, "unknown": "x"})
    assert query.wanted() == SessionFilter()
    assert query.order == "-created"
    assert query.page == 1


def test_values_become_the_read_models_filter() -> None:
    query = SessionsQuery.parse(
        {
            "task": "task-1",
            "termination": "active",
            "purpose": "validation",
            "excluded": "no",
            "fork": "edited_history",
            "min_reward": "0.5",
            "max_reward": "1",
            "sort": "-reward",
            "page": "3",
        }
    )
    assert query.wanted() == SessionFilter(
        task="task-1",
        termination="active",
        purpose="validation",
        excluded=False,
        fork="edited_history",
        min_reward=0.5,
        max_reward=1.0,
    )
    assert (query.order, query.page) == ("-reward", 3)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("sort", "reward; drop table runs"),
        ("purpose", "test"),
        ("excluded", "maybe"),
        ("min_reward", "lots"),
        ("max_reward", "inf"),
        ("page", "0"),
        ("page", "99999999"),
        ("task", "t" * 501),
    ],
)
def test_a_bad_value_names_its_parameter(name: str, value: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        SessionsQuery.parse({name: value})
    assert raised.value.status == 400
    assert raised.value.message.startswith(f"{name}: ")


def test_links_change_one_parameter_and_keep_the_others() -> None:
    query = SessionsQuery.parse({"task": "a&b", "fork": "any", "page": "2"})
    link = query.link(sort="turns", page=None)
    assert parse_qs(link[1:]) == {"task": ["a&b"], "fork": ["any"], "sort": ["turns"]}
    assert parse_qs(query.link()[1:])["page"] == ["2"]
    assert SessionsQuery().link() == "?"
    assert SessionsQuery(task="x").link(page=1, sort="-created") == "?task=x"  # the defaults
