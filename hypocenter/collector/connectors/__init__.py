"""Pull connectors: scope an attempt from a scheduler and collect its evidence (see base.py)."""
