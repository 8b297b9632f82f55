"""bench/bench_weight_fanout.py in a tiny configuration: 3 real receivers, a 4 MB update, every sender capped.

The benchmark's curves mean something only if every receiver applied exactly the version sent, the egress is
what each mode claims (one copy for a relay, N for a direct push), and the cap holds on every path.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_weight_fanout.py"
CAP_MB_S = 8.0
N = 3


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """The benchmark script as a module (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("bench_weight_fanout", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hosts(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two receiver processes of two receivers each, every receiver's relaying capped at CAP_MB_S."""
    hosts = bench.Hosts(2, 2, tensors=1, log_dir=tmp_path_factory.mktemp("fanout"))
    try:
        hosts.command({"rate_mb_s": CAP_MB_S})
        yield hosts
    finally:
        hosts.close()
    assert all(p.returncode == 0 for p in hosts.procs), [p.returncode for p in hosts.procs]


@pytest.mark.parametrize(("mode", "copies_from_trainer", "copies_on_slowest_link"), [
    ("direct", N, N),  # the trainer's NIC carries every copy
    ("chain", 1, 1),  # every link one copy
    ("tree", 1, 2),  # the root feeds two children through its one NIC
])  # fmt: skip
def test_every_receiver_applies_the_version_at_the_cap(
    bench: ModuleType, hosts: Any, mode: str, copies_from_trainer: int, copies_on_slowest_link: int
) -> None:
    import torch

    from grpo.common.weights.codec import weights_checksum

    tensors = {"layers.000.weight": torch.randn(bench.ELEMENTS)}
    version = {"direct": 1, "chain": 2, "tree": 3}[mode]
    arm = bench.push_arm(hosts, tensors, version, mode, N, CAP_MB_S)
    size = 4 * bench.ELEMENTS
    applied = {k: v for reply in hosts.command({"applied": version}) for k, v in reply["applied"].items()}
    assert {t.replica_id: (applied[t.replica_id][0], applied[t.replica_id][1]) for t in hosts.targets(N)} == {
        t.replica_id: (version, weights_checksum(tensors)) for t in hosts.targets(N)
    }
    assert len(applied) == N  # the fourth receiver was not in this push
    assert arm["egress_bytes"] == copies_from_trainer * size
    # The slowest link carries its copies at the cap (less the one burst of credit a bucket starts with).
    floor = (copies_on_slowest_link * size - 256 * 1024) / (CAP_MB_S * 1e6)
    assert arm["applied_s"] >= floor, arm
    assert arm["push_s"] >= arm["applied_s"]
