"""What the checks share: the repo's paths and the carried model, work sizes, the run context, timing and
comparison helpers, the synthetic GRPO batch and prompts (torch and our packages imported inside functions)."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[2]
SRC_DIRS = [REPO / "common" / "src", REPO / "services" / "trainer" / "src", REPO / "services" / "rollout" / "src"]
# The repo root too: the synthetic batch is tests/support/samples.py's, shared with the tests and bench_trainer.
SEARCH_PATH = [*SRC_DIRS, REPO]
CARRIED_MODEL = REPO / ".gpu-carry" / "model"
# The carried model's recipe (grpo.common.tiny_model overrides): rebuilt with it when the folder is missing.
MODEL_RECIPE: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 3,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
# Adam's first step is lr·g/(|g|+eps): eps well above float noise keeps parameter comparisons about the gradient.
LEARNER_DEFAULTS: dict[str, Any] = {"lr": 1e-3, "adam_eps": 1e-4, "seed": 0, "beta": 0.0}

if TYPE_CHECKING:
    import torch

    from grpo.trainer.learner import Learner, TrainableSample


@dataclass(frozen=True)
class Sizes:
    """How much work each check does: real sizes on a GPU, small ones on a CPU."""

    groups: int  # GRPO batch: groups × group_size samples
    group_size: int
    prompt_len: tuple[int, int]
    completion_len: tuple[int, int]
    micro_batch: int
    warmup: int  # untimed steps before the timed ones
    reps: int  # timed steps (median reported)
    logprob_prompts: int  # check 2: prompts × n sampled, max tokens
    logprob_n: int
    logprob_tokens: int
    gen_prompts: int  # check 4 on the device: prompts × n, max new tokens
    gen_n: int
    gen_tokens: int
    cpu_gen_prompts: int  # check 4 on the CPU (and the same size on the device, for a like-for-like ratio)
    cpu_gen_n: int
    cpu_gen_tokens: int
    greedy_prompts: int  # check 5: greedy generations compared with the trainer's model
    greedy_tokens: int
    deepspeed_timeout_s: int


GPU_SIZES = Sizes(
    groups=8,
    group_size=8,
    prompt_len=(32, 96),
    completion_len=(64, 256),
    micro_batch=16,
    warmup=2,
    reps=5,
    logprob_prompts=16,
    logprob_n=4,
    logprob_tokens=128,
    gen_prompts=16,
    gen_n=8,
    gen_tokens=128,
    cpu_gen_prompts=4,
    cpu_gen_n=4,
    cpu_gen_tokens=32,
    greedy_prompts=8,
    greedy_tokens=48,
    deepspeed_timeout_s=120,
)
CPU_SIZES = Sizes(
    groups=2,
    group_size=4,
    prompt_len=(6, 12),
    completion_len=(6, 20),
    micro_batch=4,
    warmup=1,
    reps=2,
    logprob_prompts=3,
    logprob_n=2,
    logprob_tokens=16,
    gen_prompts=2,
    gen_n=2,
    gen_tokens=16,
    cpu_gen_prompts=2,
    cpu_gen_n=2,
    cpu_gen_tokens=16,
    greedy_prompts=2,
    greedy_tokens=12,
    deepspeed_timeout_s=400,
)


@dataclass
class Ctx:
    device: torch.device
    model: str
    out: Path
    sizes: Sizes
    vocab: int

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of fn(), the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


def median_ms(times: list[float]) -> float:
    return 1000.0 * statistics.median(times) if times else float("nan")


def rel_diff(a: float, b: float) -> float:
    """|a − b| / |b| (b the reference); 0 when both are 0."""
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b != 0 else float("inf")


def tensor_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (L2, float64)."""
    a, b = a.double(), b.double()
    denom = float(b.norm())
    return float((a - b).norm()) / denom if denom > 0 else float("inf")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    import torch

    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    import torch

    return torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    import torch

    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten().cpu()
            for p in model.parameters()
        ]
    )


def synthetic_batch(sizes: Sizes, vocab: int, seed: int = 0) -> list[TrainableSample]:
    """Random-token GRPO groups with group-normalised advantages of random 0/1 rewards (never all equal)."""
    from tests.support.samples import normalised_coin_flips, random_groups

    low, high = 5, vocab - 10
    return random_groups(
        sizes.groups,
        sizes.group_size,
        prompt_len=sizes.prompt_len,
        completion_len=sizes.completion_len,
        tokens=(low, high),
        advantage=normalised_coin_flips,
        seed=seed,
    )


def make_learner(ctx: Ctx, precision: str, **overrides: Any) -> Learner:
    from grpo.trainer.learner import Learner, LearnerConfig

    options = {**LEARNER_DEFAULTS, "micro_batch_size": ctx.sizes.micro_batch, **overrides}
    return Learner(LearnerConfig(model=ctx.model, device=str(ctx.device), precision=precision, **options))


@contextlib.contextmanager
def freed() -> Iterator[None]:
    """Collect garbage and empty the CUDA cache after a block (the checks run one after another in one process)."""
    try:
        yield
    finally:
        gc.collect()
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def prompt_texts(n: int, seed: int = 1) -> list[str]:
    """Questions from the tiny model's own synthetic corpus (what its tokenizer was trained on)."""
    from grpo.common.tiny_model import training_corpus

    problems = training_corpus(size=n, seed=seed)[3:]  # the first three are fixed phrases
    return [p.split(" <think>")[0] for p in problems][:n]


def encode_prompts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Chat-formatted prompts, tokenised the way the rollout service does."""
    out = []
    for text in texts:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        out.append(list(tokenizer.encode(chat, add_special_tokens=False)))
    return out


def model_vocab(model: str) -> int:
    return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])


def clean(value: Any) -> Any:
    """JSON-safe: non-finite floats as strings, tuples as lists, other objects as str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)
