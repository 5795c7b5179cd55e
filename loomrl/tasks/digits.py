"""A toy task with a dense reward: the fraction of a response's characters that are digits.

Random tiny models never produce a correct arithmetic answer, so their rewards would all be 0 and
GRPO's advantages vanish. This reward varies from response to response, so training on it really
moves the parameters: what tests of training machinery (placement invariance, resume) need.
"""

from __future__ import annotations

from dataclasses import dataclass

from loomrl.reward import RewardResult
from loomrl.tasks.arithmetic import ArithmeticTask
from loomrl.tasks.base import Example


@dataclass
class DigitsTask:
    seed: int = 0
    eval_size: int = 8
    level: int = 1
    name: str = "digits"

    def __post_init__(self) -> None:
        self._questions = ArithmeticTask(level=self.level, seed=self.seed, eval_size=self.eval_size)

    def train_item(self, index: int) -> Example:
        return self._questions.train_item(index)

    def eval_set(self) -> list[Example]:
        return self._questions.eval_set()

    def score(self, response_text: str, example: Example) -> RewardResult:
        text = response_text[:10_000]
        frac = sum(c.isdigit() for c in text) / max(1, len(text))
        return RewardResult(reward=frac, parsed=None, malformed=False)
