"""TokenIds: an immutable int32 id sequence that behaves like the tuple it replaced."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from proxy.tokens import TokenIds


def test_equal_to_tuples_lists_and_itself_and_hashes_by_value() -> None:
    ids = TokenIds([5, 70000, 3])
    assert ids == (5, 70000, 3)
    assert (5, 70000, 3) == ids  # noqa: SIM300 - the reflected comparison is the point
    assert ids == [5, 70000, 3]
    assert ids == TokenIds((5, 70000, 3))
    assert ids != (5, 70000)
    assert ids != TokenIds([5, 70000, 4])
    assert hash(ids) == hash(TokenIds(np.array([5, 70000, 3], dtype=np.int64)))
    assert {ids: 1}[TokenIds([5, 70000, 3])] == 1


def test_sequence_behaviour() -> None:
    ids = TokenIds(range(10))
    assert len(ids) == 10
    assert ids[3] == 3
    assert isinstance(ids[3], int)
    assert ids[-1] == 9
    assert ids[2:5] == (2, 3, 4)
    assert isinstance(ids[2:5], TokenIds)
    assert list(ids) == list(range(10))
    assert all(isinstance(i, int) for i in ids)
    assert 7 in ids
    assert 11 not in ids
    assert ids.index(4) == 4


def test_concatenation_from_either_side_and_join() -> None:
    ids = TokenIds([1, 2])
    # Concatenation is what is under test here, not a style choice.
    assert ids + (3,) == (1, 2, 3)  # noqa: RUF005
    assert (0,) + ids == (0, 1, 2)  # noqa: RUF005
    assert [0] + ids == (0, 1, 2)  # noqa: RUF005
    assert ids + TokenIds([3]) == (1, 2, 3)
    assert TokenIds.join(ids, (), [3, 4], TokenIds()) == (1, 2, 3, 4)
    assert TokenIds.join() == ()
    assert TokenIds.join((), ids) is ids  # nothing to copy


def test_read_only_and_slices_are_views() -> None:
    source = np.array([1, 2, 3, 4], dtype=np.int32)
    ids = TokenIds(source)
    source[0] = 99  # the caller's writeable array was copied
    assert ids[0] == 1
    with pytest.raises(ValueError, match="read-only"):
        ids.array[0] = 7
    window = ids[1:3]
    assert np.shares_memory(window.array, ids.array)
    assert np.asarray(ids) is ids.array


def test_ids_outside_int32_are_refused() -> None:
    with pytest.raises(OverflowError):
        TokenIds([2**31])
    with pytest.raises(OverflowError):
        TokenIds([-(2**31) - 1])
    assert TokenIds([2**31 - 1, -(2**31)]) == (2**31 - 1, -(2**31))
    with pytest.raises(OverflowError):
        TokenIds(iter([5, 2**40]))  # any iterable, any width
    with pytest.raises(OverflowError):
        TokenIds(np.array([2**31], dtype=np.int64))


def test_a_nested_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="flat"):
        TokenIds([[1, 2], [3, 4]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="flat"):
        TokenIds(np.array([[1, 2]], dtype=np.int64))


def test_serialises_to_the_same_json_and_bytes_as_a_tuple() -> None:
    values = (0, 151643, 42, 2**31 - 1)
    ids = TokenIds(values)
    assert orjson.dumps({"input_ids": ids.array}, option=orjson.OPT_SERIALIZE_NUMPY) == (
        orjson.dumps({"input_ids": list(values)})
    )
    assert orjson.dumps(ids[1:3].array, option=orjson.OPT_SERIALIZE_NUMPY) == b"[151643,42]"
    assert ids.tobytes() == np.asarray(values, dtype="<i4").tobytes()


def test_repr_stays_short_for_long_prompts() -> None:
    assert repr(TokenIds([1, 2])) == "TokenIds([1, 2])"
    assert len(repr(TokenIds(range(100_000)))) < 80


def test_strided_slices_are_contiguous_for_serialisation() -> None:
    ids = TokenIds(range(6))
    assert ids[::2] == (0, 2, 4)
    assert orjson.dumps(ids[::2].array, option=orjson.OPT_SERIALIZE_NUMPY) == b"[0,2,4]"


def test_join_can_copy_a_lone_slice_so_it_stops_sharing_its_array() -> None:
    whole = TokenIds(range(100))
    tail = whole[90:]
    assert np.shares_memory(TokenIds.join(tail).array, whole.array)
    copied = TokenIds.join(tail, copy=True)
    assert copied == tuple(range(90, 100))
    assert not np.shares_memory(copied.array, whole.array)
