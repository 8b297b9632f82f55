"""Code shared by the GRPO services: settings, logging, gRPC servers, auth, ports."""
