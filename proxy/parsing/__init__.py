"""Incremental parsing of sampled tokens into canonical output events (see ``parser``)."""

from proxy.parsing.parser import OutputParser

__all__ = ["OutputParser"]
