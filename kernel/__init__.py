"""The shared kernel: what every other package of lego-proxy may import, and nothing else.

It owns the one exception tree (``kernel.errors``), the layout of a data directory
(``kernel.paths``), and the loopback helpers that tests, benchmarks and the command line
share (``kernel.threaded``: an ASGI app on a real uvicorn server in a thread;
``kernel.process``: a server command in a child process, waited for until it answers),
and the process group a weight update travels on, which the trainer and the engine both
join (``kernel.weight_group``, SGLang's layout; the only kernel module that needs torch).
It imports no other package of the project (``tests/test_layers.py`` keeps it so).
"""
