"""Exporters: where diagnoses go (store, Prometheus, Loki, Grafana). Never see raw logs."""
