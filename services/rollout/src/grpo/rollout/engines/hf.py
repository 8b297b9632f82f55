"""The transformers engine: its own batched sampling loop over the model's KV cache, CPU or GPU."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo.common.weights.codec import model_weights, specs_of, weights_checksum
from grpo.rollout.engines.base import Engine, GenerationCancelled, PromptOutput, Sample, SamplingParams, always
from grpo.rollout.engines.sampling import (
    find_stop,
    prompt_seed,
    sample_grouped,
    sample_tokens,
    stop_token_ids,
    stop_window,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16"}
# Compact the batch (drop finished rows from the KV cache) once this share of it is done.
COMPACT_FRACTION = 0.25


@dataclass
class _Row:
    """One sample being generated."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    text: str | None = None


class HFEngine(Engine):
    name = "hf"

    def __init__(
        self, model: str, dtype: str = "float32", device: str = "auto", torch_threads: int | None = None
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if torch_threads:
            torch.set_num_threads(torch_threads)
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, DTYPES[dtype]))
        # transformers wraps `to` with functools.wraps, which mypy does not bind as a method
        loaded.to(self.device).eval()  # type: ignore[arg-type]
        if self.device.type == "cpu":
            # from_pretrained maps the checkpoint file: the first weight update would pay a copy-on-write
            # fault per page (6x a later update, measured at 190 MB). Private memory now, at start-up.
            with torch.no_grad():
                for param in loaded.parameters():  # tied parameters are listed once
                    param.data = param.data.clone()
        self._attach(loaded)
        log.info("hf engine: %s on %s (%s), %d tensors", model, self.device, dtype, len(self._weights))

    def _attach(self, model: Any) -> None:
        """Generate from `model` (on self.device, with self.tokenizer set)."""
        self.model = model
        config = self.model.config
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or self.tokenizer.model_max_length)
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self._weights = model_weights(self.model)
        # Only the last position's logits are ever read: without this, prefill builds [batch, prompt, vocab] of
        # them (4 prompts x 1000 tokens x a 152k vocab: 2.3 GiB). Models that predate the argument get none.
        self.forward_kwargs: dict[str, Any] = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {}
        )

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for value in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(value)
        return ids

    def weight_specs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return specs_of(self._weights)

    def weights(self) -> dict[str, torch.Tensor]:
        """The live weight tensors by checkpoint name (no copies)."""
        return self._weights

    def weights_checksum(self) -> str:
        return weights_checksum(self._weights)

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        import torch

        with torch.no_grad():
            for name, value in tensors.items():
                self._weights[name].copy_(value)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, wanted: Callable[[], bool] = always
    ) -> list[PromptOutput]:
        import torch

        if not prompts:
            return []
        with torch.inference_mode(), _without_cudnn_attention():
            rows = self._sample(prompts, params, wanted)
        outputs = []
        for i, prompt in enumerate(prompts):
            chunk = rows[i * params.n : (i + 1) * params.n]
            outputs.append(PromptOutput(list(prompt), [self._to_sample(r) for r in chunk]))
        return outputs

    def _to_sample(self, row: _Row) -> Sample:
        if row.text is None:
            body = row.tokens[:-1] if row.tokens and row.tokens[-1] in self.eos_ids else row.tokens
            row.text = self.tokenizer.decode(body, skip_special_tokens=True)
        return Sample(row.tokens, row.logprobs, row.text, row.finish or "length")

    def _prefill(self, prompts: list[list[int]], n: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Run the prompts once (left-padded), then repeat cache and logits n times per prompt."""
        import torch
        from transformers import DynamicCache

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **self.forward_kwargs,
        )
        logits = out.logits[:, -1, :].float()
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            mask = mask.repeat_interleave(n, dim=0)
        return cache, logits, mask

    def _generators(self, count: int, params: SamplingParams) -> list[torch.Generator] | None:
        """One generator per prompt, seeded from (seed, prompt index); None when unseeded or greedy."""
        import torch

        if (params.seed is None and params.seeds is None) or params.temperature == 0:
            return None
        generators = []
        for i in range(count):
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seeds[i] if params.seeds is not None else prompt_seed(params.seed or 0, i))
            generators.append(generator)
        return generators

    def _sample(self, prompts: list[list[int]], params: SamplingParams, wanted: Callable[[], bool]) -> list[_Row]:
        import torch

        if not wanted():
            raise GenerationCancelled("the caller went away before generation began")
        generators = self._generators(len(prompts), params)
        stop_ids = self.eos_ids | stop_token_ids(self.tokenizer, params.stop)
        cache, logits, mask = self._prefill(prompts, params.n)
        rows = [_Row() for _ in range(len(prompts) * params.n)]
        active = list(range(len(rows)))  # batch row -> index into rows
        alive = [True] * len(active)
        window = stop_window(params.stop)
        for step in range(params.max_new_tokens):
            if not wanted():  # each step: an abandoned call gives the engine back within one decoding step
                raise GenerationCancelled(f"the caller went away after {step} of {params.max_new_tokens} tokens")
            if generators is None:
                tokens, logps = sample_tokens(logits, params, None)
            else:
                groups: dict[int, list[int]] = {}
                for b, a in enumerate(alive):
                    if a:
                        groups.setdefault(active[b] // params.n, []).append(b)
                tokens, logps = sample_grouped(logits, params, [(g, generators[p]) for p, g in groups.items()])
            last = step == params.max_new_tokens - 1
            for b, (tok, lp) in enumerate(zip(tokens.tolist(), logps.tolist(), strict=True)):
                if not alive[b]:
                    continue
                row = rows[active[b]]
                row.tokens.append(tok)
                row.logprobs.append(lp)
                if tok in stop_ids or (params.stop and self._hit_stop(row, params.stop, window)):
                    row.finish, alive[b] = "stop", False
                elif last:
                    row.finish = "length"
            if last or not any(alive):
                break
            done = alive.count(False)
            if done >= max(1, int(len(alive) * COMPACT_FRACTION)):
                keep = [b for b, a in enumerate(alive) if a]
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, tokens = mask[index], tokens[index]
                active, alive = [active[b] for b in keep], [True] * len(keep)
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            positions = mask.sum(-1, keepdim=True) - 1
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                **self.forward_kwargs,
            )
            logits = out.logits[:, -1, :]
        return rows

    def _hit_stop(self, row: _Row, stops: tuple[str, ...], window: int) -> bool:
        # Decode only a tail window each step; the full text is decoded once a stop string shows up.
        if find_stop(self.tokenizer.decode(row.tokens[-window:], skip_special_tokens=True), stops) is None:
            return False
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        end = find_stop(text, stops)
        if end is None:
            return False
        row.text = text[:end]
        return True


@contextlib.contextmanager
def _without_cudnn_attention() -> Iterator[None]:
    """Scaled-dot-product attention by any kernel but cuDNN's. cuDNN's builds a graph for each new shape, and in
    decoding the shape changes every step (the keys grow by one): measured on an H200 in bf16 (bench/gpu_check/,
    2026-12-04), generation ran 11-14x slower with it. On a CPU this changes nothing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield
