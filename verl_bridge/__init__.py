"""lego-proxy inside verl: one trial per verl sample, its trajectory as verl's outputs.

verl's agent loop (``verl.experimental.agent_loop``, verl 0.9.1, the V1 trainer) asks a
registered loop for each sample's outputs. ``verl_bridge.agent_loop.LegoProxyAgentLoop``
(registered as ``lego_proxy``) answers with a lego-proxy trial: a session on the proxy,
the real harness in a sandbox, the grader, the finish, and the session's trajectory read
back through the export API, converted segment by segment.

- ``convert``: the pure conversion, trajectory -> verl's output fields (no verl, no IO).
- ``episode``: one sample's IO, synchronous: session, trial, finish, trajectory.
- ``settings``: what the loop needs to know (proxy, run, harness, pool, sandbox).
- ``verl_api``: the typed boundary to verl (loaded on demand, never at import).
- ``agent_loop``: the verl subclass; importing it needs verl installed.

Nothing here imports verl at module level except ``agent_loop``, so the package (and its
tests of the conversion) work where verl is not installed. Nothing in lego-proxy imports
this package: verl imports it.
"""
