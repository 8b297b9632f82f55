"""The program single runs start from (init.c): found, or built once with the C compiler, or None.

Without it a run's PID 1 is a fork of the zygote that sets up in Python: as safe, about a millisecond slower per
run. It runs as root until it drops to the run's uid, so only a file we own and no one else may change is used.

The images build it at build time (`python -m grpo.reward.sandbox.init_program PATH`, named by
$GRPO_SANDBOX_INIT); elsewhere it is built into the cache ($GRPO_CACHE_DIR or ~/.cache/grpo) on first use.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from grpo.common.tiny_model import cache_root
from grpo.reward.sandbox.base import SandboxUnavailable

SOURCE = Path(__file__).with_name("init.c")
ENV = "GRPO_SANDBOX_INIT"
log = logging.getLogger(__name__)


def build(path: Path) -> None:
    """Compile init.c, static (the sandbox root need not hold its libraries), into `path`, atomically."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FileNotFoundError("no C compiler (cc) on PATH")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        subprocess.run(
            [cc, "-O2", "-static", "-s", "-o", str(tmp), str(SOURCE)], check=True, capture_output=True, timeout=120
        )
        tmp.replace(path)
    except subprocess.CalledProcessError as exc:
        raise OSError(f"{cc} could not build {SOURCE.name}: {exc.stderr.decode(errors='replace')[-500:]}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def _ours(path: Path) -> bool:
    """Owned by us and writable by no one else, and so is its folder."""
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def init_program() -> str | None:
    """The path of the built init.c for this source, or None (with a warning) where it cannot be built."""
    named = os.environ.get(ENV)
    if named:
        if not Path(named).is_file() or not _ours(Path(named)):
            raise SandboxUnavailable(
                f"${ENV}={named} is not a file owned by uid {os.geteuid()} that only it can change"
            )
        return named
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    path = cache_root() / "sandbox" / f"init-{digest}"
    try:
        if path.is_file() and _ours(path):
            return str(path)
        if path.parent.exists() and not _ours(path.parent):
            path = Path(tempfile.mkdtemp(prefix="grpo-sandbox-")) / path.name  # a cache others may write to
        build(path)
        return str(path)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("single sandbox runs set up in Python, about 1 ms slower each: %s (install gcc and libc6-dev)", exc)
        return None


if __name__ == "__main__":
    build(Path(sys.argv[1]))
