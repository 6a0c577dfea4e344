"""Wire adapters: one module per protocol, each pure translation to/from ``proxy.canonical``."""
