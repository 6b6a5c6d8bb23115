"""Generated gRPC/protobuf modules of hypocenter.v1 (from attribution.proto; do not edit them by hand)."""
