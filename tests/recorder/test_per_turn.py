"""recorder.per_turn: the bound values of a turn's row, and what of them counts as its
size (the SQLite path's checkpoint estimate)."""

from __future__ import annotations

from dataclasses import replace

from recorder import rows
from recorder.per_turn import TurnColumns
from recorder.records import TurnRecord
from tests.recorder.builders import experts, make_turn, rich_turn


def bound(turn: TurnRecord) -> list[object]:
    return TurnColumns.of_table().values(dict(rows.encode_turn(turn).row))


def test_a_rows_size_grows_with_its_token_arrays_and_messages_only() -> None:
    columns = TurnColumns.of_table()
    short = make_turn("s", 0, prompt=(1, 2, 3))
    long = make_turn("s", 0, prompt=tuple(range(1003)))  # 1,000 more ids of 4 bytes
    assert columns.size(bound(long)) - columns.size(bound(short)) == 4000
    renamed = replace(short, id="x" * 200, session_id="y" * 200, requested_model="z" * 200)
    assert columns.size(bound(renamed)) == columns.size(bound(short))  # fixed-size fields
    routed = rich_turn("s", 0, experts(1, [[[3, 7]], [[1, 2]]]))
    with_messages = replace(routed, request_messages=routed.request_messages + b"x" * 500)
    assert columns.size(bound(with_messages)) - columns.size(bound(routed)) == 500


def test_json_columns_are_bound_as_json_text_and_a_missing_column_as_its_default() -> None:
    columns = TurnColumns.of_table()
    row = dict(rows.encode_turn(make_turn("s", 0)).row)
    del row["classification"]  # a row spooled before the column existed
    values = dict(zip(columns.names, columns.values(row), strict=True))
    assert values["classification"] == "root"
    assert values["side_requests"] == "null"  # JSON null, as SQLAlchemy binds None
    assert values["ignored_fields"] == "[]"
    assert values["prompt_ids"] == row["prompt_ids"]
