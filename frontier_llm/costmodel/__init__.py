"""The analytical cost model: FLOPs, memory, communication and step time (pure functions)."""
