"""SWE-bench's parser and rule, imported without its Docker and Modal orchestration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tasks.swebench_rules import load_rules

ROOT = Path(__file__).resolve().parents[2]
LOG = """\
============================= test session starts ==============================
collected 5 items

tests/test_ops.py ...F.s                                                 [100%]
=========================== short test summary info ============================
PASSED tests/test_ops.py::test_mean
PASSED tests/test_ops.py::test_clamp_inside
FAILED tests/test_ops.py::test_clamp_above_high - assert 0 == 10
SKIPPED [1] tests/test_ops.py:20: needs a GPU
SKIPPED tests/test_ops.py::test_gpu
ERROR tests/test_ops.py::test_fixture - fixture 'db' not found
1 failed, 2 passed, 1 skipped, 1 error in 0.06s
"""


def test_the_grading_modules_import_without_docker_or_modal() -> None:
    probe = (
        "import sys\n"
        "from tasks.swebench_rules import load_rules\n"
        "load_rules()\n"
        "heavy = sorted(m for m in ('docker', 'modal', 'datasets') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_pytest_log_is_read_as_swebench_reads_it() -> None:
    assert load_rules().parse(LOG) == {
        "tests/test_ops.py::test_mean": "PASSED",
        "tests/test_ops.py::test_clamp_inside": "PASSED",
        "tests/test_ops.py::test_clamp_above_high": "FAILED",
        "tests/test_ops.py::test_gpu": "SKIPPED",
        "tests/test_ops.py::test_fixture": "ERROR",
    }


def test_resolved_needs_every_fail_to_pass_passing_and_no_pass_to_pass_broken() -> None:
    rules = load_rules()
    statuses = rules.parse(LOG)
    mean, inside = "tests/test_ops.py::test_mean", "tests/test_ops.py::test_clamp_inside"
    above, gpu = "tests/test_ops.py::test_clamp_above_high", "tests/test_ops.py::test_gpu"
    assert rules.resolved(statuses, [mean], [inside])
    assert rules.resolved(statuses, [mean], [gpu])  # a skipped P2P test is no regression
    assert not rules.resolved(statuses, [gpu], [mean])  # a skipped F2P test is no fix
    assert not rules.resolved(statuses, [above], [mean])
    assert not rules.resolved(statuses, [mean], ["tests/test_ops.py::test_fixture"])
    assert not rules.resolved(statuses, ["tests/test_ops.py::test_missing"], [mean])
    assert rules.passed(gpu, statuses, skip_ok=True)
    assert not rules.passed(gpu, statuses, skip_ok=False)
