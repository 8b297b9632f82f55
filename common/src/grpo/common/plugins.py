"""Plug-ins named `package.module:function` (reward functions, tools, rejection-sampling filters): one importer."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def import_function(path: str, setting: str) -> Callable[..., Any]:
    """The callable `path` names; ValueError naming the setting and the path when it cannot be loaded."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{setting}: {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{setting}: plug-in {path!r}: cannot import module {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{setting}: plug-in {path!r}: module {module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]
