"""Collect and normalise: connectors that turn logs, metrics and scheduler state into sources."""
