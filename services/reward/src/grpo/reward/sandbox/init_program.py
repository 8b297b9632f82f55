"""The program single runs start from (init.c): found, or built once with the C compiler, or None.

Without it a run's PID 1 is a fork of the zygote that sets up in Python: as safe, about 2 ms slower per
run. It runs as root until it drops to the run's uid, so the file must be one no one else could have put there
or changed: it and every folder above it owned by us (or root) and writable by no one else. The service then
holds it open, and each zygote copies what it holds into its root, not what the path names later.

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
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not os.access(path.parent, os.W_OK):
        raise PermissionError(f"{path.parent} is not ours to write to")
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        subprocess.run(
            [cc, "-O2", "-static", "-s", "-o", str(tmp), str(SOURCE)], check=True, capture_output=True, timeout=120
        )
        tmp.chmod(0o755)  # whatever the umask
        tmp.replace(path)
    except subprocess.CalledProcessError as exc:
        raise OSError(f"{cc} could not build {SOURCE.name}: {exc.stderr.decode(errors='replace')[-500:]}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def _trusted(path: Path) -> bool:
    """`path` (resolved) and every folder above it owned by us or root and writable by no one else (a sticky
    folder, like /tmp, aside: no one else may rename or remove what is ours in it)."""
    for p in (path, *path.parents):
        st = p.stat()
        shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if st.st_uid not in (0, os.geteuid()) or (shared and not (p != path and st.st_mode & stat.S_ISVTX)):
            return False
    return True


def _open(path: Path) -> int:
    """The trusted file at `path`, held open: the zygotes copy it, whatever the path names later."""
    path = path.resolve()
    if not path.is_file() or not _trusted(path):
        raise PermissionError(f"{path} is not a file that only uid {os.geteuid()} (or root) could have put there")
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def init_program() -> int | None:
    """An fd of the built init.c for this source, or None (with a warning) where it cannot be built."""
    named = os.environ.get(ENV)
    if named:
        try:
            return _open(Path(named))
        except OSError as exc:
            raise SandboxUnavailable(f"${ENV}={named}: {exc}") from exc
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    path = cache_root() / "sandbox" / f"init-{digest}"
    try:
        try:
            if not path.is_file():
                build(path)
            return _open(path)
        except PermissionError:  # a cache others may write to, or we may not: a private folder of our own
            path = Path(tempfile.mkdtemp(prefix="grpo-sandbox-")) / path.name
            build(path)
            return _open(path)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("single sandbox runs set up in Python, about 2 ms slower each: %s (install gcc and libc6-dev)", exc)
        return None


if __name__ == "__main__":
    build(Path(sys.argv[1]))
