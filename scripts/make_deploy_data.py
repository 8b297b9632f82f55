"""Write the small arithmetic data set the compose file and the Helm chart ship (k8s/grpo/files/).

The rows are the demo's task (grpo.demo.task) in the trainer's data format, so a deployment
has something to train on out of the box: sft.jsonl (worked answers, R1's cold start), train.jsonl
(GRPO prompts) and eval.jsonl (held out from both). Regenerate with `python scripts/make_deploy_data.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo.demo.task import make_splits, prompt_rows, worked_answer

OUT = Path(__file__).resolve().parents[1] / "k8s" / "grpo" / "files"


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows))


def main() -> None:
    splits = make_splits(n_sft=4096, n_grpo=2048, n_eval=256, seed=0)
    OUT.mkdir(parents=True, exist_ok=True)
    sft = [{"id": f"sft-{i}", "prompt": p.prompt, "response": worked_answer(p)} for i, p in enumerate(splits.sft)]
    write_jsonl(OUT / "sft.jsonl", sft)
    write_jsonl(OUT / "train.jsonl", prompt_rows(splits.grpo, "train"))
    write_jsonl(OUT / "eval.jsonl", prompt_rows(splits.eval, "eval"))


if __name__ == "__main__":
    main()
