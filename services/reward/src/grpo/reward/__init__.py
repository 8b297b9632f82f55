"""The reward service: a sandboxed verifier API over gRPC and HTTP."""
