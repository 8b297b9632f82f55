"""One compose project as the compose tests drive it: `docker compose -p <project> -f <files> ...` with the test's
environment, a service's exit code, files out of the checkpoints volume, and what the project left in Docker.

Needs a Docker engine and compose: the v2 plugin (`docker compose`) when present, else v1 (`docker-compose`).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def compose_command() -> list[str]:
    """`docker compose` (v2 plugin) when present, else `docker-compose` (v1); AssertionError when neither is."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise AssertionError("no docker compose: install Docker with the compose plugin (or docker-compose)")


@dataclass
class ComposeProject:
    name: str  # compose's project name (-p): what `down -v` and the resource labels go by
    files: list[Path]  # the compose files, in merge order
    env: dict[str, str]  # the shell compose runs in: its ${VAR} interpolation reads this

    def command(self, *args: str) -> list[str]:
        return [*compose_command(), "-p", self.name, *(x for f in self.files for x in ("-f", str(f))), *args]

    def compose(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.command(*args), cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def logs(self, service: str, tail: int = 80) -> str:
        return self.compose("logs", "--no-color", f"--tail={tail}", service, check=False).stdout

    def wait_exit(self, service: str, timeout: float, while_waiting: Callable[[], None] | None = None) -> int:
        """The exit code of the service's (first) container once it has stopped (a restart policy that restarts
        it keeps it from counting as stopped); `while_waiting` is called before each look, to watch the run."""
        container = self.compose("ps", "-q", service).stdout.split()[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if while_waiting is not None:
                while_waiting()
            state = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", container],
                                   capture_output=True, text=True).stdout.split()  # fmt: skip
            if state and state[0] == "exited":
                return int(state[1])
            time.sleep(2)
        raise AssertionError(f"{service} still running after {timeout:.0f}s\n{self.logs(service)}")

    def read_file(self, service: str, path: str) -> str:
        """The text of one file in `service`'s volumes, read by a one-off container of the service."""
        done = self.compose("run", "--rm", "--no-deps", "--entrypoint", "cat", service, path, check=False)
        assert done.returncode == 0, f"cannot read {path} from {service}'s volumes: {done.stderr}"
        return done.stdout

    def copy_out(self, service: str, folder: str, target: Path) -> Path:
        """`folder` of `service`'s volumes copied to `target`, through a one-off container of the service (as the
        README copies a run's results out: tar in the container, unpacked here)."""
        args = ("run", "--rm", "--no-deps", "-T", "--entrypoint", "tar", service, "-C", folder, "-cf", "-", ".")
        done = subprocess.run(self.command(*args), cwd=REPO, env=self.env, capture_output=True, timeout=300)
        assert done.returncode == 0, f"cannot copy {folder} out of {service}: {done.stderr.decode(errors='replace')}"
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=BytesIO(done.stdout)) as archive:
            archive.extractall(target, filter="data")
        return target

    def resources(self) -> dict[str, list[str]]:
        """The project's containers, networks and volumes still in Docker (by compose's project label)."""
        label = f"label=com.docker.compose.project={self.name}"
        out = {}
        for kind, cmd in {
            "containers": ["ps", "-a"],
            "networks": ["network", "ls"],
            "volumes": ["volume", "ls"],
        }.items():
            listed = subprocess.run(["docker", *cmd, "-q", "--filter", label], capture_output=True, text=True)
            out[kind] = listed.stdout.split()
        return out
