"""Rollouts: a real harness runs each task in a sandbox, is graded, and its session finished.

The top of the rollout side (above ``sandbox`` and ``tasks``); it talks to the proxy only
over HTTP (the control API), as any orchestrator would, so it imports nothing of ``proxy``.
Owns the harness launchers (config files and command lines of the four real CLIs), one
trial's stages (Table 4 of the paper), the concurrent runner, and its summary.
"""
