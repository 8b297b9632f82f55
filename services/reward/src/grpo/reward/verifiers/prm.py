"""A process reward model (PRM): the probability that each step is good, read at a separator after the step.

Used as open PRMs are (Qwen2.5-Math-PRM): the steps are joined with the separator token (`<extra_0>`) after each
one, put in the chat template as the assistant's turn after the prompt (plain `prompt\\n` + steps without a
template), and the model's two-label logits at the separators give P(good) = softmax(logits)[1]. A folder whose
architecture is a `...ForTokenClassification` loads with transformers' own class; anything else (Qwen2.5-Math-PRM's
`Qwen2ForProcessRewardModel`) through AutoModel, which needs prm_trust_remote_code. Local folder or hub id alike.

torch and transformers are imported only when a PRM is configured (the `reward-model` extra).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from grpo.reward.verifiers.steps import Span, StepJudgement

log = logging.getLogger(__name__)


class ProcessRewardModel:
    def __init__(
        self,
        path: str,
        step_token: str = "<extra_0>",
        max_length: int = 4096,
        trust_remote_code: bool = False,
        device: str = "cpu",
    ) -> None:
        try:
            import torch
            from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification, AutoTokenizer
        except ImportError as exc:
            raise RuntimeError("a PRM needs the 'reward-model' extra: pip install 'grpo-reward[reward-model]'") from exc
        self._torch = torch
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        self.step_id = self.tokenizer.convert_tokens_to_ids(step_token)
        if self.step_id is None or self.step_id == self.tokenizer.unk_token_id:
            raise ValueError(f"the PRM's tokenizer has no {step_token!r} token (prm_step_token)")
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        if any(a.endswith("ForTokenClassification") for a in config.architectures or ()):
            if config.num_labels != 2:
                raise ValueError(
                    f"a PRM has two labels (bad, good step); this token classifier has {config.num_labels}"
                )
            self.model: Any = AutoModelForTokenClassification.from_pretrained(path)
        else:
            self.model = AutoModel.from_pretrained(path, trust_remote_code=trust_remote_code)
        wanted, loaded = list(config.architectures or ()), type(self.model).__name__
        if wanted and loaded not in wanted:  # e.g. the bare body without its score head: scores would be noise
            hint = " (set prm_trust_remote_code: the folder ships its own head)" if not trust_remote_code else ""
            raise ValueError(f"the PRM folder's architecture is {wanted}, but transformers loaded {loaded}{hint}")
        self.model.to(device).eval()
        self.step_token, self.max_length, self.device = step_token, max_length, device
        self._lock = threading.Lock()  # one forward at a time: torch already uses every core
        log.info("process reward model loaded from %s", path)

    def text(self, prompt: str, completion: str, spans: list[Span]) -> str:
        """The PRM's input: the prompt, then every step followed by the separator."""
        # A separator inside the prompt or a step's own text would shift every later score: it is removed there.
        prompt = prompt.replace(self.step_token, "")
        steps = "".join(
            completion[start:end].replace(self.step_token, "").strip() + self.step_token for start, end in spans
        )
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": steps}]
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False))
        return f"{prompt}\n{steps}"

    def score(self, prompt: str, completion: str, spans: list[Span]) -> list[StepJudgement]:
        """One judgement per span: P(good) at its separator; null for a step cut off by prm_max_length."""
        torch = self._torch
        ids = self.tokenizer(self.text(prompt, completion, spans), add_special_tokens=False)["input_ids"]
        ids = ids[: self.max_length]
        with self._lock, torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=self.device))
        logits = out.logits if hasattr(out, "logits") else out[0]  # [1, T, 2]
        if logits.dim() != 3 or logits.shape[-1] != 2:
            raise ValueError(f"a PRM gives two logits (bad, good) per token; this one gave {list(logits.shape)}")
        good = torch.softmax(logits[0].float(), dim=-1)[:, 1]
        at = [i for i, token in enumerate(ids) if token == self.step_id]
        judged = []
        for k, (start, end) in enumerate(spans):
            if k < len(at):
                judged.append(_step(start, end, float(good[at[k]])))
            else:
                why = f"the step is past the PRM's {self.max_length}-token limit"
                judged.append(StepJudgement(start, end, None, "cannot_judge", why))
        return judged


def _step(start: int, end: int, good: float) -> StepJudgement:
    """A step's P(good); nan (nan or infinite logits: a broken forward pass) fails the step, never a score."""
    if not math.isfinite(good):
        return StepJudgement(start, end, None, "error", f"the PRM returned {good}")
    return StepJudgement(start, end, good, "ok")
