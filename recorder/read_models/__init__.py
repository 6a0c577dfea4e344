"""The Live UI's read models: what its pages show, read from the recorder's tables.

Each module takes the ``Store`` and returns frozen results, aggregating and paginating in
SQL with a fixed number of statements per page: ``overview`` (a run's numbers per weight
version), ``tables`` (runs, tasks and sessions, paged), ``session_view`` (one session's
tree of turns); ``facts`` holds the SQL they share. ``behaviour`` (LEGO-RL Table 9: what
the agent did, first vs last third of a run) cannot be counted in SQL: ``traces`` reads a
bounded number of sessions' answers and tool results, a batch of sessions per statement,
``harness_tools`` / ``shell_commands`` read each harness's tool calls as actions, and
``pass_k`` holds the pass@k / pass^k estimators over prompt groups.
Rows become values through ``recorder.rows`` (rewards, re-labels), like every other
reader's. Rendering is the proxy's (``proxy.ui``), and so is decoding token ids into text.
"""
