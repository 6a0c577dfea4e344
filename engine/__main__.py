"""``python -m engine``: run the local SGLang-compatible engine."""

from engine.cli import main

main()
