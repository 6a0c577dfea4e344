"""SGLang 0.5.23's own request checks, loaded from the real ``sglang`` package.

``sglang_checks()`` returns ``(generate_contract_error, SamplingParams)`` from the pinned
wheel (``make install`` puts ``sglang==0.5.23`` in with ``--no-deps``):
``generate_contract_error(body)`` is the schema gate SGLang's ``/generate`` applies before
anything else (``sglang.srt.entrypoints.api_contract``, over ``sglang.api.v1.api_types``),
and ``SamplingParams(**params).verify(vocab_size)`` is its range check
(``sglang.srt.sampling.sampling_params``). Those modules need only msgspec and torch.

The package's own ``__init__`` starts the whole runtime, so the modules come through
``tests.support.sglang_package`` (``SGLangUnavailable`` when they cannot).
``GenerateReqInput`` (``managers/io_struct``) is not loaded: it imports
``sglang.srt.utils`` (triton, a 1 GB wheel with no use on a CPU) and ``schedule_batch`` ->
``sglang.srt.configs`` -> transformers' ``AutoProcessor`` -> torchvision, which would have to
match, and replace, the pinned CPU torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.sglang_package import import_sglang

ContractCheck = Callable[[object], str | None]


def sglang_checks() -> tuple[ContractCheck, Any]:
    contract, sampling = import_sglang(
        "sglang.srt.entrypoints.api_contract", "sglang.srt.sampling.sampling_params"
    )
    check: ContractCheck = contract.generate_contract_error
    return check, sampling.SamplingParams
