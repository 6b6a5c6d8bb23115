"""The running service: ingest pipeline, triggers, pollers, analysis, compaction, outputs.

It never imports the listeners (api/): cli/assembly.py builds both and wires them."""
