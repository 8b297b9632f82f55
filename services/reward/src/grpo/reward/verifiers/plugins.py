"""User reward functions loaded from `pkg.mod:fn`, with TRL's signature.

`fn(prompts, completions, **kwargs) -> list[float | None]`: one call per request with
every item that asked for the plug-in; kwargs arrive column-wise (one list per key, None
where an item did not give that key). None means the plug-in cannot judge that item.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo.reward.verifiers.result import Judgement

RewardFn = Callable[..., Sequence[float | None]]


def load_function(path: str) -> RewardFn:
    """Import `pkg.mod:fn`; raises ValueError with a message that names the path."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"plug-in path {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import plug-in module {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def load_plugins(paths: Mapping[str, str]) -> dict[str, RewardFn]:
    """Load every configured plug-in by name."""
    return {name: load_function(path) for name, path in paths.items()}


def columns(kwargs_per_item: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Row-wise kwargs to TRL's column-wise form."""
    keys = sorted({k for row in kwargs_per_item for k in row})
    return {k: [row.get(k) for row in kwargs_per_item] for k in keys}


def run_plugin(
    fn: RewardFn, prompts: list[str], completions: list[str], kwargs_per_item: Sequence[Mapping[str, Any]]
) -> list[Judgement]:
    """Call the plug-in once for a batch; a broken plug-in is an error for each item, never a 0."""
    try:
        scores = list(fn(prompts, completions, **columns(kwargs_per_item)))
    except Exception as exc:
        return [Judgement(None, "error", f"plug-in raised {type(exc).__name__}: {exc}"[:500])] * len(prompts)
    if len(scores) != len(prompts):
        detail = f"plug-in returned {len(scores)} scores for {len(prompts)} completions"
        return [Judgement(None, "error", detail)] * len(prompts)
    return [_judge(score) for score in scores]


def _judge(score: Any) -> Judgement:
    if score is None:
        return Judgement(None, "cannot_judge", "plug-in returned None")
    try:
        value = float(score)
    except (TypeError, ValueError):
        return Judgement(None, "error", f"plug-in returned {type(score).__name__}, not a number")
    if not math.isfinite(value):
        return Judgement(None, "error", f"plug-in returned {value}")
    return Judgement(value, "ok")
