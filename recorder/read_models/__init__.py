"""The Live UI's read models: what its pages show, read from the recorder's tables.

Each module takes the ``Store`` and returns frozen results, aggregating and paginating in
SQL with a fixed number of statements per page: ``overview`` (a run's numbers per weight
version), ``tables`` (runs, tasks and sessions, paged), ``session_view`` (one session's
tree of turns); ``facts`` holds the SQL they share. Rows become values through
``recorder.rows`` (rewards, re-labels), like every other reader's. Rendering is the
proxy's (``proxy.ui``), and so is decoding token ids into text.
"""
