"""The closed loop (``lego-proxy loop``): validate, roll out, train, push weights, repeat.

Stacks on the rollout side (``rollouts``, over HTTP) and the trainer (``trainer_bridge``);
nothing below imports it, and it imports nothing of the proxy: it reaches a proxy it
started or one it was pointed at by URL, as any orchestrator would.
"""
