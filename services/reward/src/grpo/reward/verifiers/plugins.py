"""User reward functions loaded from `pkg.mod:fn`, with TRL's signature.

`fn(prompts, completions, **kwargs) -> list[float | None]`: one call per request with
every item that asked for the plug-in; kwargs arrive column-wise (one list per key, None
where an item did not give that key). None means the plug-in cannot judge that item.
`prompts` and `completions` are the service's own arguments: no item's kwargs may use them
(RESERVED_KWARGS, refused when a request is validated).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo.common.plugins import import_function
from grpo.reward.verifiers.result import Judgement

RewardFn = Callable[..., Sequence[float | None]]
RESERVED_KWARGS = frozenset({"prompts", "completions"})


def load_plugins(paths: Mapping[str, str]) -> dict[str, RewardFn]:
    """Load every configured plug-in by name."""
    return {name: import_function(path, "plugins") for name, path in paths.items()}


def columns(kwargs_per_item: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Row-wise kwargs to TRL's column-wise form."""
    keys = sorted({k for row in kwargs_per_item for k in row})
    return {k: [row.get(k) for row in kwargs_per_item] for k in keys}


def run_plugin(
    fn: RewardFn, prompts: list[str], completions: list[str], kwargs_per_item: Sequence[Mapping[str, Any]]
) -> list[Judgement]:
    """Call the plug-in once for a batch; a broken plug-in is an error for each item, never a 0.

    A TypeError from the batched call is most often one item's kwargs (a key the function does not take, a
    required one an item left out): the items are then called one by one, so the error stays with its item.
    """
    try:
        return _call(fn, prompts, completions, kwargs_per_item)
    except TypeError as exc:
        if len(prompts) == 1:
            return [_raised(exc)]
    return [
        _call_or_error(fn, [prompt], [completion], [kwargs])[0]
        for prompt, completion, kwargs in zip(prompts, completions, kwargs_per_item, strict=True)
    ]


def _call_or_error(
    fn: RewardFn, prompts: list[str], completions: list[str], kwargs_per_item: Sequence[Mapping[str, Any]]
) -> list[Judgement]:
    try:
        return _call(fn, prompts, completions, kwargs_per_item)
    except TypeError as exc:
        return [_raised(exc)] * len(prompts)


def _call(
    fn: RewardFn, prompts: list[str], completions: list[str], kwargs_per_item: Sequence[Mapping[str, Any]]
) -> list[Judgement]:
    """One call; raises only the plug-in's TypeError (the caller may retry item by item)."""
    try:
        scores = list(fn(prompts, completions, **columns(kwargs_per_item)))
    except TypeError:
        raise
    # Anything at all, SystemExit (sys.exit, argparse) and KeyboardInterrupt included, is the plug-in's failure
    # for these items: raised out of a thread's future it would stop the service's event loop.
    except BaseException as exc:
        return [_raised(exc)] * len(prompts)
    if len(scores) != len(prompts):
        detail = f"plug-in returned {len(scores)} scores for {len(prompts)} completions"
        return [Judgement(None, "error", detail)] * len(prompts)
    return [_judge(score) for score in scores]


def _raised(exc: BaseException) -> Judgement:
    return Judgement(None, "error", f"plug-in raised {type(exc).__name__}: {exc}"[:500])


def _judge(score: Any) -> Judgement:
    """A real number (bool counts as 0 / 1, as TRL takes it), finite as a float; None cannot judge."""
    if score is None:
        return Judgement(None, "cannot_judge", "plug-in returned None")
    # numbers.Real, not float(): float("0.75") would take a string, which the scoring table says fails.
    if not isinstance(score, numbers.Real):
        return Judgement(None, "error", f"plug-in returned {type(score).__name__}, not a number")
    try:
        value = float(score)
    except OverflowError:
        return Judgement(None, "error", f"plug-in returned {type(score).__name__} too large for a float (over 1e308)")
    except Exception as exc:  # a Real subclass with a broken __float__: still this item's failure only
        return Judgement(None, "error", f"plug-in returned {type(score).__name__} that float() refused: {exc}"[:500])
    if not math.isfinite(value):
        return Judgement(None, "error", f"plug-in returned {value}")
    return Judgement(value, "ok")
