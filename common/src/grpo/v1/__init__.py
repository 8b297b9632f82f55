"""Generated gRPC code for the grpo.v1 contract (proto/grpo/v1). Regenerate with `make protos`."""
