"""What the reward-hack defenses did in one trial: the ``events`` of the finish body.

The image build says what it hid from the agent (the real history's commits and refs, the
withheld tests); the grader says what it undid (edits under ``test_paths`` reverted, new
files there removed). Each is one ``DefenseEvent``; ``as_json`` is the shape the rollout
runner posts and the Live UI shows:

    {"kind": "test_path_reverted", "detail": "1 file under test_paths reverted",
     "items": ["tests/test_ops.py"]}
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DefenseKind(StrEnum):
    HISTORY_HIDDEN = "history_hidden"  # items: the real repository's refs the agent lacks
    TESTS_WITHHELD = "tests_withheld"  # items: the files tests.patch adds or changes
    TEST_PATH_REVERTED = "test_path_reverted"  # items: edited or deleted files, restored
    TEST_FILE_REMOVED = "test_file_removed"  # items: files the agent added under test_paths


@dataclass(frozen=True, slots=True)
class DefenseEvent:
    kind: DefenseKind
    detail: str
    items: tuple[str, ...] = ()

    def as_json(self) -> dict[str, str | list[str]]:
        return {"kind": self.kind.value, "detail": self.detail, "items": list(self.items)}
