"""The Live UI's rendering: server-rendered pages that show a run while it goes.

What the pages show comes from the recorder's read models (``recorder.read_models``);
this package only renders it: ``charts`` draws SVG, ``pages`` renders the Jinja2
templates in ``templates/`` (the collapse table from ``kernel.trend``), ``queries``
validates the sessions list's query string. ``proxy.routes.ui`` serves them under ``/ui``
behind the admin key; ``docs/live-ui.md`` says what each page answers.
"""
