"""The outcome ledger: every task's fate (trained or the drop reason), one segment per checkpoint.

A segment `ledger/step-XXXXXXXX.jsonl` holds the outcomes resolved since the previous step's checkpoint.
The checkpoint of that step carries the same list and the segment is written (atomically, whole) just after
it: a crash in between leaves a segment behind its checkpoint, never ahead of it. On resume from step S,
segments after S belong to the lost lineage and are deleted and segment S is rewritten from the checkpoint
(checkpoint.rewind), so the union of the segments is exactly the outcomes the restored model reflects: an
auditable "each task once" record that stays small per file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

_SEGMENT = re.compile(r"^step-(\d{8,})\.jsonl$")


def segment_path(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}.jsonl"


def write_segment(root: Path, step: int, outcomes: Iterable[tuple[str, str]]) -> Path:
    """Replace the segment of `step` with `outcomes`: all of the step's, a re-save's earlier ones included."""
    root.mkdir(parents=True, exist_ok=True)
    final = segment_path(root, step)
    tmp = final.with_suffix(".tmp")
    with tmp.open("w") as f:
        for task_id, outcome in outcomes:
            f.write(json.dumps({"task_id": task_id, "outcome": outcome, "step": step}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(final)
    return final


def drop_after(root: Path, step: int) -> int:
    """Delete segments written after `step` (the lineage a resume discards); returns how many."""
    if not root.is_dir():
        return 0
    gone = 0
    for path in root.iterdir():
        m = _SEGMENT.match(path.name)
        if (m and int(m.group(1)) > step) or path.suffix == ".tmp":
            path.unlink()
            gone += 1
    return gone


def read_segment(root: Path, step: int) -> list[tuple[str, str]]:
    """The outcomes of one segment (none if it does not exist)."""
    path = segment_path(root, step)
    if not path.is_file():
        return []
    return [(e["task_id"], e["outcome"]) for e in map(json.loads, filter(None, path.read_text().splitlines()))]


def read_ledger(root: Path) -> list[dict[str, object]]:
    """All outcomes in step order."""
    if not root.is_dir():
        return []
    segments = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _SEGMENT.match(p.name)))
    return [json.loads(line) for _, p in segments for line in p.read_text().splitlines() if line]
