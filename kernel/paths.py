"""Where things live under a data directory (``LEGO_DATA_DIR``), for every package.

- ``default_model_dir(data_dir)``: ``data_dir/models/tiny-qwen3-moe-v1``, the tiny model the
  local engine builds on first use and the proxy's default tokenizer.

Only names are decided here; ``engine.tiny`` builds what the directory holds.
"""

from __future__ import annotations

from pathlib import Path

TINY_MODEL_NAME = "tiny-qwen3-moe-v1"


def default_model_dir(data_dir: Path) -> Path:
    return data_dir / "models" / TINY_MODEL_NAME
