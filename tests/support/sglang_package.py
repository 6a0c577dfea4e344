"""The pinned ``sglang`` package's modules, imported without running its ``__init__``.

``make install`` puts ``sglang==0.5.23`` in with ``--no-deps`` (plus only what the modules
the tests use import: see ``pyproject.toml``). ``sglang/__init__.py`` starts the whole
runtime (torch, triton, the server), so ``import_sglang(*names)`` registers ``sglang`` once
as a bare package (a real module spec, its ``__path__`` the installed package's, its
``__init__`` not run) and imports the named submodules under it. Every test helper that
needs SGLang's own code goes through here, so they share that one registration.

``SGLangUnavailable`` says why the modules cannot be imported (not installed, another
version, an import that fails here).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from importlib import metadata

PINNED = "0.5.23"


class SGLangUnavailable(Exception):
    pass


def import_sglang(*names: str) -> list[types.ModuleType]:
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError as exc:
        raise SGLangUnavailable("sglang is not installed (make install adds it)") from exc
    if version != PINNED:
        raise SGLangUnavailable(f"sglang {version} is installed; the tests pin {PINNED}")
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SGLangUnavailable("the sglang package has no importable location")
        package = types.ModuleType("sglang")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = importlib.machinery.ModuleSpec("sglang", None, is_package=True)
        package.__spec__.submodule_search_locations = package.__path__
        sys.modules["sglang"] = package
    try:
        return [importlib.import_module(name) for name in names]
    except ImportError as exc:
        raise SGLangUnavailable(f"SGLang's modules do not import here: {exc}") from exc
