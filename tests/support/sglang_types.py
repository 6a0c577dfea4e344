"""SGLang 0.5.23's own request checks, loaded from the real ``sglang`` package.

``sglang_checks()`` returns ``(generate_contract_error, SamplingParams)`` from the pinned
wheel (``make install`` puts ``sglang==0.5.23`` in with ``--no-deps``):
``generate_contract_error(body)`` is the schema gate SGLang's ``/generate`` applies before
anything else (``sglang.srt.entrypoints.api_contract``, over ``sglang.api.v1.api_types``),
and ``SamplingParams(**params).verify(vocab_size)`` is its range check
(``sglang.srt.sampling.sampling_params``). Those modules need only msgspec and torch.

The package's own ``__init__`` starts the whole runtime (hf patches, ``sglang.lang``, and
through ``sglang.srt.utils`` triton), so the loader registers ``sglang`` as a bare package
for the duration of the import and removes what it added from ``sys.modules`` afterwards;
the functions keep their modules alive. ``GenerateReqInput`` (``managers/io_struct``) is not
loaded: it imports ``sglang.srt.utils`` (triton, a 1 GB wheel with no use on a CPU) and
``schedule_batch`` -> ``sglang.srt.configs`` -> transformers' ``AutoProcessor`` ->
torchvision, which would have to match, and replace, the pinned CPU torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ContractCheck = Callable[[object], str | None]


def sglang_checks() -> tuple[ContractCheck, Any]:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError("sglang is not installed: run make install")
    root = Path(next(iter(spec.submodule_search_locations)))
    before = set(sys.modules)
    if "sglang" not in sys.modules:  # else someone imported the real package: use it
        package = types.ModuleType("sglang")
        package.__path__ = [str(root)]
        sys.modules["sglang"] = package
    try:
        contract = importlib.import_module("sglang.srt.entrypoints.api_contract")
        sampling = importlib.import_module("sglang.srt.sampling.sampling_params")
    finally:
        for name in set(sys.modules) - before:
            if name == "sglang" or name.startswith("sglang."):
                del sys.modules[name]
    check: ContractCheck = contract.generate_contract_error
    return check, sampling.SamplingParams
