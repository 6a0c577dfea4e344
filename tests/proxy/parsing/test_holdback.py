from __future__ import annotations

import pytest

from proxy.parsing.holdback import StopTrimmer, partial_suffix_len


@pytest.mark.parametrize(
    ("text", "markers", "whole", "expected"),
    [
        ("hello", ("<think>",), False, 0),
        ("hello <", ("<think>",), False, 1),
        ("hello <thin", ("<think>",), False, 5),
        ("hello <think>", ("<think>",), False, 0),  # a whole tag is found, not held
        ("hello <think>", ("<think>",), True, 7),
        ("a </", ("<think>", "</think>"), False, 2),
        ("<tool", ("</tool_call>", "<tool_call>"), False, 5),
        ("xSTO", ("STOP", "TO"), True, 3),
        ("xST", ("STOP", "T"), True, 2),
        ("", ("<think>",), False, 0),
    ],
)
def test_partial_suffix_len(
    text: str, markers: tuple[str, ...], whole: bool, expected: int
) -> None:
    assert partial_suffix_len(text, markers, whole=whole) == expected


def test_stop_trimmer_holds_a_possible_stop_and_trims_the_matched_one() -> None:
    trimmer = StopTrimmer(("</end>",))
    assert trimmer.push("answer </e") == "answer "
    assert trimmer.push("n") == ""
    assert trimmer.push("d>") == ""
    assert trimmer.finish("</end>") == ""


def test_stop_trimmer_releases_a_false_alarm() -> None:
    trimmer = StopTrimmer(("</end>",))
    assert trimmer.push("a </e") == "a "
    assert trimmer.push("x") == "</ex"
    assert trimmer.push("</en") == ""
    assert trimmer.finish(None) == "</en"


def test_stop_trimmer_keeps_text_that_does_not_end_with_the_stop() -> None:
    trimmer = StopTrimmer(("STOP",))
    assert trimmer.push("ST") == ""
    assert trimmer.finish("STOP") == "ST"


def test_stop_trimmer_without_stops_passes_everything() -> None:
    trimmer = StopTrimmer(("",))
    assert trimmer.push("abc") == "abc"
    assert trimmer.finish("abc") == ""
