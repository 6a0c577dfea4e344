"""The one ``lego-proxy`` command line, above every other package.

``cli.main`` parses the command line and starts what was asked: the proxy (``serve``),
the local engine (``engine``), a migration (``db upgrade``), the trainer (``train``) or
the guided demo (``demo``, ``cli.demo``). Nothing below imports it.
"""
