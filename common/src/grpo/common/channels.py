"""Client gRPC channels the one way every service opens them: plaintext, or TLS trusting a given CA."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from grpo.common.grpc_server import MAX_MESSAGE_BYTES

# Messages as large as the servers accept (a whole weight chunk, a big Score batch). Reconnect attempts to a
# peer that went away back off to at most 2 s (gRPC's default is 120 s), so a restarted service is found soon.
DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


def make_channel(
    address: str,
    ca_file: str | Path | None = None,
    options: Sequence[tuple[str, Any]] = DEFAULT_OPTIONS,
    root_certificates: bytes | None = None,
) -> grpc.Channel:
    """A channel to `address`: TLS verified against `ca_file` (or the PEM `root_certificates`) when given.

    Without either it is plaintext; there is no fallback from TLS to plaintext.
    """
    if ca_file and root_certificates is None:
        try:
            root_certificates = Path(ca_file).read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read the TLS CA file {ca_file}: {exc.strerror}") from exc
    if root_certificates is None:
        return grpc.insecure_channel(address, options=list(options))
    credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    return grpc.secure_channel(address, credentials, options=list(options))
