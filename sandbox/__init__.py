"""Isolated execution for rollouts: one command in a sandbox with a chosen network.

The bottom layer of the rollout side (it imports only ``kernel``). ``sandbox.spec`` holds
the contract every backend implements (``SandboxSpec`` in, ``ExecResult`` out);
``sandbox.backends.make_sandbox(name)`` picks a backend by its ``--sandbox`` name:
``bwrap`` (``sandbox.bwrap``, the default; ``sandbox.inside`` and ``sandbox.bridge`` make
its proxy-only network), ``podman`` or ``docker`` (``sandbox.containers``, with the egress
rule of ``sandbox.egress``). ``sandbox.registry`` records every live sandbox and
``sandbox.reap`` cleans up after dead runners; ``sandbox.k8s`` renders a trial as a Pod and
a NetworkPolicy. docs/sandbox.md says what each isolates and what was measured.
"""
