"""Isolated execution for rollouts: one command in a sandbox with a chosen network.

The bottom layer of the rollout side (it imports only ``kernel``). ``sandbox.spec`` holds
the contract every backend implements (``SandboxSpec`` in, ``ExecResult`` out); the
backends (bubblewrap, the default; podman; docker) live beside it, with the proxy-only
egress bridge, the reaper for what a dead runner left, and the Kubernetes Pod emitter.
"""
