"""The Live UI's read models: what its pages show, read from the recorder's tables.

Each module takes the ``Store`` and returns frozen results, aggregating and paginating in
SQL with a fixed number of statements per page: ``overview`` (a run's numbers per weight
version, validation apart, the trainer's steps), ``steps`` (stage times and terminations
per trainer step), ``epochs`` (the success histogram of prompt groups per epoch),
``tables`` (runs, tasks and sessions, paged; sessions filtered and sorted),
``session_view`` (one session's tree of turns); ``facts`` holds the SQL they share and
``forks`` the pure diff of a fork against its parent. Rows become values through
``recorder.rows`` (rewards, re-labels), like every other reader's. Rendering is the
proxy's (``proxy.ui``), and so is decoding token ids into text.
"""
