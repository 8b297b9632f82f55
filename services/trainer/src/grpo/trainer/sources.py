"""The train_data setting's sources: data files with their mixing weights, and references to an earlier stage's data
(and the names a stage's `model` may reference).

Loads no data and no torch: the settings check a train_data value here at start-up (check_train_data), and the run
reads its files and weights from here (data_sources); stages.py resolves the references before either sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo.trainer.config import TrainerSettings

MODEL_REFERENCES = ("base", "previous")  # a stage's `model`: the run's model, the latest trained stage's final/


@dataclass(frozen=True)
class Source:
    """One training data file and its mixing weight (None: a bare item of a list that weighs nothing explicitly, or
    a single file: its rows are simply drawn with the others')."""

    path: Path
    weight: float | None = None


def is_reference(value: str | Path) -> bool:
    """Whether a train_data item names an earlier stage's data (`previous`, `stage:<N>`) rather than a file."""
    text = str(value)
    return text == "previous" or text.startswith("stage:")


def item_data(item: str | dict[str, Any]) -> str:
    """The path or reference of one train_data list item."""
    return item if isinstance(item, str) else str(item["data"])


def check_train_data(value: Path | list[str | dict[str, Any]] | None) -> list[Source]:
    """The sources of a train_data value; ValueError naming the item that is not a path, reference or {data,
    weight}. A reference left here was not resolved by plan_stages: it is outside `stages`."""
    if value is None:
        return []
    items: list[str | dict[str, Any]] = [str(value)] if isinstance(value, Path) else list(value)
    if not items:
        raise ValueError("train_data is an empty list: give at least one file")
    sources = []
    for n, item in enumerate(items, 1):
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"data", "weight"})
            if unknown or not isinstance(item.get("data"), str | Path) or not str(item["data"]).strip():
                raise ValueError(f"train_data item {n} {item!r}: must be a path, or {{data: <path>, weight: <number "
                                 f"> 0>}}{f' (unknown keys {unknown})' if unknown else ''}")  # fmt: skip
            weight = item.get("weight")
            if weight is not None and (
                isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < float("inf")
            ):
                raise ValueError(f"train_data item {n} ({item['data']}): weight {weight!r} must be a number > 0")
        elif not item.strip():
            raise ValueError(f"train_data item {n} is empty: give a file")
        data = item_data(item)
        if is_reference(data):
            raise ValueError(f"train_data {data!r} refers to an earlier stage's data: only a stage's train_data may "
                             "(inside `stages`, after a rejection_sampling stage)")  # fmt: skip
        weight = item.get("weight") if isinstance(item, dict) else None
        sources.append(Source(Path(data), None if weight is None else float(weight)))
    if any(source.weight is not None for source in sources):  # a weighted list: a bare item weighs 1
        sources = [Source(s.path, 1.0 if s.weight is None else s.weight) for s in sources]
    return sources


def data_sources(settings: TrainerSettings) -> list[Source]:
    """The run's (or stage's) training data files with their weights (each None unless the list is weighted)."""
    return check_train_data(settings.train_data)
