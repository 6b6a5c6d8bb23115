"""The running service: ingest pipeline, triggers, pollers, analysis, compaction, outputs, assembly."""
