"""The Live UI's read models: what its pages show, read from the recorder's tables.

Each module takes the ``Store`` and returns frozen results, aggregating and paginating in
SQL with a fixed number of statements per page: ``overview`` (a run's numbers per weight
version, validation apart, the trainer's steps), ``steps`` (stage times and terminations
per trainer step), ``epochs`` (the success histogram of prompt groups per epoch),
``tables`` (runs, tasks and sessions, paged; sessions filtered and sorted),
``session_view`` (one session's tree of turns); ``facts`` holds the SQL they share and
``forks`` the pure diff of a fork against its parent. ``behaviour`` (LEGO-RL Table 9: what
the agent did, first vs last third of a run) cannot be counted in SQL: ``traces`` reads a
bounded number of sessions' answers and tool results, a batch of sessions per statement,
``harness_tools`` / ``shell_commands`` read each harness's tool calls as actions, and
``pass_k`` holds the pass@k / pass^k estimators over prompt groups.
Rows become values through ``recorder.rows`` (rewards, re-labels), like every other
reader's. Rendering is the proxy's (``proxy.ui``), and so is decoding token ids into text.
"""
