"""collector: turn LLM-agent episodes into training data you can trust.

Data flows one way: config -> job (Ray workers) -> episode loop -> provider adapters and
environment -> episode record -> shard writer -> analysis.
"""

__version__ = "0.1.0"
