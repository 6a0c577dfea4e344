"""The Live UI: server-rendered pages that show a run while it goes.

``facts``/``overview``/``tables``/``session_view`` query the recorder's tables (SQLAlchemy
Core, aggregated and paginated in SQL); ``collapse`` is the trend test; ``charts`` draws
SVG; ``pages`` renders the Jinja2 templates in ``templates/``. ``proxy.routes.ui`` serves
them under ``/ui`` behind the admin key.
"""
