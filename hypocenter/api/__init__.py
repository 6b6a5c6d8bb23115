"""The service APIs (gRPC, REST, web UI)."""
