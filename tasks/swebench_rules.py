"""SWE-bench's own pytest log parser and resolution rule, without its Docker harness.

The grader reads a test log the way SWE-bench does (``parse_log_pytest``: one status per
``PASSED``/``FAILED``/``ERROR``/``SKIPPED``/``XFAIL`` line, as ``pytest -rA`` prints them)
and decides the reward by its rule (``get_eval_tests_report`` + ``get_resolution_status``:
resolved iff every FAIL_TO_PASS test passes and every PASS_TO_PASS test passes or is
skipped). ``swebench`` is installed ``--no-deps`` (``make install``): its
``swebench/harness/__init__.py`` imports the Docker and Modal orchestration (``docker``,
``modal``, ``datasets``), which lego-proxy neither needs nor wants at grade time. So
``swebench.harness`` is registered as a bare package (its ``__path__`` the installed one,
its ``__init__`` not run) and only the pure modules are imported under it: ``constants``,
``log_parsers`` (needs ``unidiff``), ``grading``.

``Rules.parse(log)`` -> test id -> status; ``Rules.resolved(statuses, f2p, p2p)``.
``SWEbenchUnavailable`` (a ``TaskError``) says why the modules cannot be imported.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from kernel.errors import TaskError

PINNED = "5.0.2"
_HARNESS = "swebench.harness"


class SWEbenchUnavailable(TaskError):
    pass


@dataclass(frozen=True, slots=True)
class Rules:
    """The three SWE-bench modules the grader calls (``load_rules`` imports them)."""

    constants: types.ModuleType
    log_parsers: types.ModuleType
    grading: types.ModuleType

    def parse(self, log: str) -> dict[str, str]:
        statuses = self.log_parsers.parse_log_pytest(log, None)
        return {str(test): str(status) for test, status in statuses.items()}

    def resolved(
        self, statuses: Mapping[str, str], fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]
    ) -> bool:
        expected = {
            self.constants.FAIL_TO_PASS: list(fail_to_pass),
            self.constants.PASS_TO_PASS: list(pass_to_pass),
        }
        report = self.grading.get_eval_tests_report(dict(statuses), expected)
        status = self.grading.get_resolution_status(report)
        return bool(status == self.constants.ResolvedStatus.FULL.value)

    def passed(self, test_id: str, statuses: Mapping[str, str], *, skip_ok: bool) -> bool:
        """SWE-bench's verdict on one test: F2P must pass; P2P may also be skipped."""
        check = self.grading.test_maintained if skip_ok else self.grading.test_passed
        return bool(check(test_id, dict(statuses)))


def load_rules() -> Rules:
    try:
        version = metadata.version("swebench")
    except metadata.PackageNotFoundError as exc:
        raise SWEbenchUnavailable("swebench is not installed (make install adds it)") from exc
    if version != PINNED:
        raise SWEbenchUnavailable(f"swebench {version} is installed; the grader pins {PINNED}")
    if _HARNESS not in sys.modules:
        spec = importlib.util.find_spec(_HARNESS)
        if spec is None or not spec.submodule_search_locations:
            raise SWEbenchUnavailable("the swebench.harness package has no importable location")
        package = types.ModuleType(_HARNESS)
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = importlib.machinery.ModuleSpec(_HARNESS, None, is_package=True)
        package.__spec__.submodule_search_locations = package.__path__
        sys.modules[_HARNESS] = package
    try:
        constants, log_parsers, grading = (
            importlib.import_module(f"{_HARNESS}.{name}")
            for name in ("constants", "log_parsers", "grading")
        )
    except ImportError as exc:
        raise SWEbenchUnavailable(f"swebench's grading modules do not import: {exc}") from exc
    return Rules(constants=constants, log_parsers=log_parsers, grading=grading)
