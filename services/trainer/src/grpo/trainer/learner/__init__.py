"""The learner: scored groups → parameter updates (GRPO and SFT), on plain PyTorch or DeepSpeed."""

from grpo.trainer.learner.batch import SftPair, TrainableSample
from grpo.trainer.learner.config import LearnerConfig
from grpo.trainer.learner.learner import Learner
from grpo.trainer.learner.policy import LoraOptions

__all__ = ["Learner", "LearnerConfig", "LoraOptions", "SftPair", "TrainableSample"]
