"""What the run ran on: device, versions, where each package was imported from (written into gpu_check.json)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

from gpu_check.shared import Ctx


def package_versions() -> dict[str, str]:
    out = {}
    for name in (
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "deepspeed",
        "grpcio",
        "grpcio-health-checking",
        "grpcio-reflection",
        "protobuf",
        "pydantic",
        "pydantic_core",
        "typing_extensions",
        "accelerate",
        "peft",
        "numpy",
        "prometheus-client",
    ):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def loaded_third_party() -> dict[str, str]:
    """Top-level non-stdlib modules this process imported, with where each came from (the import closure)."""
    out = {}
    for name, module in sorted(sys.modules.items()):
        if "." in name or name.startswith("_") or name in sys.stdlib_module_names or module is None:
            continue
        if name == "gpu_check":  # this package (it ran as __main__ when it was one file): not third party
            continue
        where = getattr(module, "__file__", None) or str(list(getattr(module, "__path__", []) or []))
        if where and "python3." in where and "site-packages" not in where and "dist-packages" not in where:
            continue  # the interpreter's own lib folder
        out[name] = where or "?"
    return out


def import_status(names: tuple[str, ...]) -> dict[str, str]:
    """Where each module loads from, or why it does not (a wrong carried or installed version shows here first)."""
    import importlib

    out = {}
    for name in names:
        try:
            module = importlib.import_module(name)
            out[name] = f"{getattr(module, '__version__', '?')} {getattr(module, '__file__', '')}"
        except Exception as exc:
            out[name] = f"FAILED {type(exc).__name__}: {exc}"
    return out


def environment(ctx: Ctx) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "device": str(ctx.device),
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_threads": torch.get_num_threads(),
        "model": ctx.model,
        "model_params": None,
        "versions": package_versions(),
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "imports": import_status(("google.protobuf", "grpc", "grpc_health", "grpc_reflection", "peft", "transformers")),
    }
    if ctx.cuda:
        env["gpu"] = torch.cuda.get_device_name(ctx.device)
        env["gpu_capability"] = list(torch.cuda.get_device_capability(ctx.device))
        env["bf16_supported"] = torch.cuda.is_bf16_supported()
    with contextlib.suppress(Exception):
        from safetensors import safe_open

        with safe_open(str(Path(ctx.model) / "model.safetensors"), "pt") as f:
            env["model_params"] = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    return env
