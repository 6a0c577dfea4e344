"""SessionLru: per-session state bounded by a count, least recently used dropped first."""

from __future__ import annotations

import pytest

from proxy.lru import SessionLru


def test_the_least_recently_used_session_is_dropped_first() -> None:
    held: SessionLru[list[int]] = SessionLru(2)
    held.put("a", [1])
    held.put("b", [2])
    assert held.get("a") == [1]  # a use: b is now the oldest
    held.setdefault("c", list)
    assert "b" not in held
    assert ("a" in held, "c" in held, len(held)) == (True, True, 2)


def test_setdefault_keeps_what_is_held_and_pop_forgets() -> None:
    held: SessionLru[list[int]] = SessionLru(3)
    first = held.setdefault("a", list)
    first.append(7)
    assert held.setdefault("a", list) == [7]
    held.pop("a")
    held.pop("never-held")
    assert held.get("a") is None
    assert len(held) == 0


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SessionLru(0)


def test_dropped_sessions_are_remembered_until_held_again() -> None:
    held: SessionLru[int] = SessionLru(1)
    held.put("a", 1)
    held.put("b", 2)  # a is dropped to make room
    assert held.was_dropped("a")
    assert not held.was_dropped("b")
    held.put("a", 1)  # reloaded: held again, b dropped
    assert not held.was_dropped("a")
    assert held.was_dropped("b")
    held.pop("a")  # forgotten (finished), not dropped
    assert not held.was_dropped("a")


def test_only_the_last_limit_dropped_ids_are_remembered() -> None:
    held: SessionLru[int] = SessionLru(2)
    for index in range(6):
        held.put(str(index), index)
    assert [held.was_dropped(str(i)) for i in range(6)] == [False, False, True, True, False, False]
