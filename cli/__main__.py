"""``python -m cli``: the same as the ``lego-proxy`` command."""

from cli.main import main

main()
