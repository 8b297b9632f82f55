"""Weight push to N replicas, direct vs relay (chain, tree of 2), with and without a per-host send cap.

The trainer side is the real one (`grpo.trainer.pusher.push_to_replicas`, direct or relay, the data ports,
the shared sha256); the replicas are N real receivers (bench/fanout_receivers.py: the rollout's servicer,
WeightUpdates, data port and Relayer, no engine), 8 per process. For each N, mode and cap it records the
time until every replica has applied the version (each receiver records when it applied it, one clock) and
until the push call returned (every reply in), the trainer's egress (`PushResult.bytes_sent`), and checks
every replica applied the version with the trainer's sha256.

Loopback has no NIC: uncapped, every arm is bound by what 2 shared cores can copy and hash. So the capped
arms give every sender (the trainer, and each relaying receiver: every host has its own NIC) a token bucket
of `--cap-mb-s` (`weights_send_rate_mb_s`, grpo.common.send_rate), chosen so that all the chain's senders
at once stay well under the machine's ceiling (the first arm, one uncapped push to one receiver, measures
it). A direct push at the cap costs N × size / cap, so it is measured up to `--direct-cap-max-n` only.

Fits, per mode and cap: time = a + levels × slope over N (levels: N for a chain, where the slope is the
per-hop delay h; the depth ⌊log2 N⌋ + 1 of a tree of 2, fitted from N = 3 on, where its root sends two copies;
N for direct, where the slope is the time per copy), and the per-hop delay of the relays from the apply times
down the tree (slope of apply time vs depth within one push).

Writes bench/results/weight_fanout.json (and docs/img/weight_fanout.png with --plot).
Usage: python bench/bench_weight_fanout.py [--replicas 1 2 4 8 16 32 64] [--mb 200] [--cap-mb-s 5]
       [--cap-mb 200] [--direct-cap-max-n 4] [--repeats 1] [--per-host 8] [--plot]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
HOST_SCRIPT = ROOT / "bench" / "fanout_receivers.py"
MODES = {"direct": ("direct", 2), "chain": ("relay", 1), "tree": ("relay", 2)}  # name: (weight_push, fanout)
ELEMENTS = 1 << 20  # fp32 elements per tensor: 4 MiB tensors
log = logging.getLogger("bench_weight_fanout")


class Hosts:
    """The receiver host processes (own process groups, ended on close), driven by one JSON line each way."""

    def __init__(self, count: int, per_host: int, tensors: int, log_dir: Path) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: list[IO[str]] = []
        for h in range(count):
            err = open(log_dir / f"host{h}.log", "w")  # noqa: SIM115 - closed in close()
            self.logs.append(err)
            cmd = [sys.executable, str(HOST_SCRIPT), "--receivers", str(per_host), "--prefix", f"h{h}",
                   "--tensors", str(tensors), "--elements", str(ELEMENTS)]  # fmt: skip
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                               text=True, start_new_session=True))  # fmt: skip
        # Started together, read in turn: the imports overlap.
        self.receivers = [json.loads(self._line(p))["receivers"] for p in self.procs]

    @staticmethod
    def _line(proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"receiver host {proc.pid} exited (rc {proc.wait()}); see its log")
        return line

    def targets(self, n: int) -> list[Any]:
        """The first n receivers, taken across hosts in turn (hop k and k + 1 in different processes)."""
        from grpo.trainer.pusher import ReplicaTarget

        per_host = len(self.receivers[0])
        order = [self.receivers[k % len(self.procs)][k // len(self.procs)] for k in range(len(self.procs) * per_host)]
        return [ReplicaTarget(r["replica_id"], r["address"], r["data_port"]) for r in order[:n]]

    def command(self, command: dict[str, Any]) -> list[dict[str, Any]]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps(command) + "\n")
            p.stdin.flush()
        return [json.loads(self._line(p)) for p in self.procs]

    def uss_bytes(self) -> list[int]:
        return [psutil.Process(p.pid).memory_full_info().uss for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            if p.stdin is not None:
                p.stdin.close()  # the host's cue to stop
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in self.logs:
            f.close()


@contextmanager
def memory_watch() -> Iterator[dict[str, float]]:
    """The least available memory (GiB) seen while the block runs, sampled every 0.5 s."""
    seen = {"min_available_gib": psutil.virtual_memory().available / 2**30}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            seen["min_available_gib"] = min(seen["min_available_gib"], psutil.virtual_memory().available / 2**30)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def depth_of(mode: str, index: int) -> int:
    """How many hops from the trainer replica `index` (0-based, breadth-first) is: 1 for the root."""
    if mode == "chain":
        return index + 1
    if mode == "tree":
        return int(math.log2(index + 1)) + 1
    return 1


def levels(mode: str, n: int) -> int:
    return max(depth_of(mode, i) for i in range(n)) if mode != "direct" else n


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares y = a + b·x: (a, b)."""
    if len(set(xs)) < 2:
        return (statistics.mean(ys), 0.0)
    b, a = statistics.linear_regression(xs, ys)
    return a, b


def push_arm(hosts: Hosts, tensors: dict[str, Any], version: int, mode: str, n: int, cap: float) -> dict[str, Any]:
    """One push of `version` to the first n receivers; what it took, checked replica by replica."""
    from grpo.common.weights.codec import weights_checksum
    from grpo.trainer.pusher import push_to_replicas

    first = next(iter(sorted(tensors)))
    tensors[first][0] = float(version)  # every version differs (and so does its sha256)
    expected = weights_checksum(tensors)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    weight_push, fanout = MODES[mode]
    targets = hosts.targets(n)
    timeout = 120 + 3 * size * (n if mode == "direct" else 2) / (cap * 1e6 if cap else 2e8)
    load = os.getloadavg()[0]
    wall, start = time.time(), time.monotonic()
    results = push_to_replicas(targets, tensors, version, timeout_s=timeout, retries=0, mode=weight_push,  # type: ignore[arg-type]
                               fanout=fanout, send_rate_mb_s=cap)  # fmt: skip
    push_s = time.monotonic() - start
    applied = {k: v for reply in hosts.command({"applied": version}) for k, v in reply["applied"].items()}
    bad = [r for r in results if not r.ok] + [
        t for t in targets if t.replica_id not in applied or applied[t.replica_id][1] != expected
    ]
    if bad:
        raise RuntimeError(f"{mode} N={n}: not every replica applied version {version} ({expected[:12]}): {bad[:3]}")
    apply_s = [applied[t.replica_id][2] - wall for t in targets]
    arm = {"mode": mode, "n": n, "cap_mb_s": cap, "bytes": size, "version": version, "load_1m": round(load, 2),
           "applied_s": round(max(apply_s), 3), "push_s": round(push_s, 3),
           "egress_bytes": sum(r.bytes_sent for r in results), "egress_copies": sum(r.bytes_sent for r in results) / size,
           "levels": levels(mode, n)}  # fmt: skip
    arm["apply_s"] = [round(s, 3) for s in apply_s]  # per replica, in `targets` order (breadth-first)
    # The per-hop delay down this one tree: apply time vs depth. A tree's root gets the whole rate and the rest
    # half of it (each parent feeds two), so its root is left out.
    below = range(1 if mode == "tree" else 0, n)
    if mode != "direct" and len({depth_of(mode, i) for i in below}) >= 3:
        arm["hop_s"] = round(fit([depth_of(mode, i) for i in below], [apply_s[i] for i in below])[1], 4)
    log.info("%-6s N=%-2d cap %-5s: applied %.2fs, push %.2fs, egress %.1f copies, load %.1f%s", mode, n,
             cap or "none", arm["applied_s"], push_s, arm["egress_copies"], load,
             f", {arm['hop_s'] * 1000:.0f} ms/hop" if "hop_s" in arm else "")  # fmt: skip
    return arm


def fits(arms: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cap and mode: applied time = a + slope × levels (levels: N for direct and chain, tree depth)."""
    out: dict[str, Any] = {}
    for cap in sorted({a["cap_mb_s"] for a in arms}):
        for mode in MODES:
            picked = [a for a in arms if a["cap_mb_s"] == cap and a["mode"] == mode and "error" not in a]
            if mode == "tree":  # from 3 on the root feeds two children (2 copies through one NIC); below, a chain
                picked = [a for a in picked if a["n"] >= 3]
            if len(picked) < 2:
                continue
            a, b = fit([p["levels"] for p in picked], [p["applied_s"] for p in picked])
            hops = [p["hop_s"] for p in picked if "hop_s" in p]
            key = f"{mode}@{cap or 'uncapped'}"
            out[key] = {"intercept_s": round(a, 3), "slope_s_per_level": round(b, 4)}
            if hops:
                out[key]["hop_s_within_push_median"] = round(statistics.median(hops), 4)
    return out


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "loadavg_start": os.getloadavg()}  # fmt: skip


def run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    max_n = max(args.replicas)
    hosts_count = min(args.hosts, max_n)
    per_host = math.ceil(max_n / hosts_count)
    tensors_n = max(1, round(args.mb * 1e6 / (4 * ELEMENTS)))
    cap_tensors = max(1, round(args.cap_mb * 1e6 / (4 * ELEMENTS)))
    result: dict[str, Any] = {"machine": machine(), "hosts": hosts_count, "receivers_per_host": per_host}
    started = time.monotonic()
    hosts = Hosts(hosts_count, per_host, tensors_n, log_dir)
    result["receivers_start_s"] = round(time.monotonic() - started, 2)
    log.info(
        "%d receivers in %d processes up in %.1fs", hosts_count * per_host, hosts_count, time.monotonic() - started
    )
    arms: list[dict[str, Any]] = []
    version = 0
    try:
        with memory_watch() as memory:
            for cap, count in ((0.0, tensors_n), (args.cap_mb_s, cap_tensors)):
                if cap and not args.cap_mb_s:
                    continue
                hosts.command({"rate_mb_s": cap})
                hosts.command({"specs": [count, ELEMENTS]})
                tensors = {f"layers.{i:03d}.weight": torch.randn(ELEMENTS) for i in range(count)}
                version += 1  # warm-up: every receiver maps its staging buffer for this size once
                push_arm(hosts, tensors, version, "tree", max_n, 0.0) if not cap else None
                for _ in range(args.repeats):
                    for n in args.replicas:
                        for mode in MODES:
                            if cap and mode == "direct" and n > args.direct_cap_max_n:
                                continue
                            version += 1
                            try:
                                arms.append(push_arm(hosts, tensors, version, mode, n, cap))
                            except RuntimeError as exc:  # kept, said, left out of the fits: the others still count
                                log.error("%s", exc)
                                arms.append({"mode": mode, "n": n, "cap_mb_s": cap, "error": str(exc)[:500]})
                            if args.out:  # what is done so far survives an interrupted run
                                args.out.write_text(json.dumps({**result, "partial": True, "arms": arms}, indent=1))
                if not cap:
                    result["receivers_uss_gib_after_uncapped"] = round(sum(hosts.uss_bytes()) / 2**30, 2)
                del tensors
        result["min_available_gib"] = round(memory["min_available_gib"], 2)
        result["trainer_rss_gib"] = round(psutil.Process().memory_info().rss / 2**30, 2)
    finally:
        hosts.close()
    result.update(arms=arms, fits=fits(arms), loadavg_end=os.getloadavg(), total_s=round(time.monotonic() - started))
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    caps = sorted({a["cap_mb_s"] for a in result["arms"]})
    for ax, cap in zip(axes, caps, strict=False):
        for mode, style in (("direct", "o-"), ("chain", "s-"), ("tree", "^-")):
            by_n: dict[int, list[float]] = {}
            for a in result["arms"]:
                if a["mode"] == mode and a["cap_mb_s"] == cap and "error" not in a:
                    by_n.setdefault(a["n"], []).append(a["applied_s"])
            ns = sorted(by_n)
            ax.plot(ns, [statistics.median(by_n[n]) for n in ns], style, label=mode)
            slope = result["fits"].get(f"direct@{cap}", {}).get("slope_s_per_level")
            if mode == "direct" and cap and slope and ns[-1] < 64:  # measured where it is already linear
                more = [n for n in (1, 2, 4, 8, 16, 32, 64) if n >= ns[-1]]
                ax.plot(more, [n * slope for n in more], "--", color=ax.lines[-1].get_color(), label="direct, N × copy")
        mb = next(a["bytes"] for a in result["arms"] if a["cap_mb_s"] == cap and "error" not in a) / 1e6
        title = f"{mb:.0f} MB, each sender capped at {cap:g} MB/s" if cap else f"{mb:.0f} MB, uncapped (loopback)"
        ax.set(xscale="log", yscale="log", xlabel="replicas N", ylabel="s until every replica applied", title=title)
        ax.set_xticks([1, 2, 4, 8, 16, 32, 64], ["1", "2", "4", "8", "16", "32", "64"])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--mb", type=float, default=200.0, help="the uncapped arms' update size")
    ap.add_argument("--cap-mb-s", type=float, default=5.0, help="every sender's cap in the capped arms (0: none)")
    ap.add_argument("--cap-mb", type=float, default=200.0, help="the capped arms' update size")
    ap.add_argument("--direct-cap-max-n", type=int, default=4, help="largest N of the capped direct arms")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--hosts", type=int, default=8, help="receiver processes")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "weight_fanout.json")
    ap.add_argument("--plot", type=Path, nargs="?", const=ROOT / "docs" / "img" / "weight_fanout.png")
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/bench_weight_fanout"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("grpo").setLevel(logging.WARNING)  # the pusher logs every replica of every push
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run's finally ends the hosts
    args.log_dir.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = run(args, args.log_dir)
    result["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)
    log.info("fits: %s", json.dumps(result["fits"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
