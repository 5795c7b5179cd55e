"""Generated integer arithmetic problems in four difficulty levels.

  level 1: single-digit addition                    "3 + 4"
  level 2: two-digit addition or subtraction         "57 - 21"   (never negative)
  level 3: two-digit +, - or *                       "34 * 12"
  level 4: three two-digit operands, +, - and *      "12 + 7 * 31"  (usual precedence)

Problems are a pure function of (level, seed, index), so every worker generates
the same item i. The held-out split is a hash of the expression, so evaluation
problems never appear in training whatever the seed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import ClassVar

from loomrl.errors import ConfigError
from loomrl.reward import RewardResult, score
from loomrl.tasks.base import Example, check_index, in_eval_split
from loomrl.tasks.expr import safe_eval

LEVELS = (1, 2, 3, 4)

# Rejection sampling of training items gives up after this many draws in the
# held-out split (only reachable with an eval_fraction close to 1).
_MAX_DRAWS = 10_000


def generate_expression(rng: random.Random, level: int) -> str:
    """One random expression of the given level (see the module docstring)."""
    if level == 1:
        return f"{rng.randint(0, 9)} + {rng.randint(0, 9)}"
    if level == 2:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if rng.random() < 0.5:
            return f"{a} + {b}"
        return f"{max(a, b)} - {min(a, b)}"
    if level == 3:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        op = rng.choice("+-*")
        if op == "-":
            a, b = max(a, b), min(a, b)
        return f"{a} {op} {b}"
    if level == 4:
        a, b, c = (rng.randint(10, 99) for _ in range(3))
        return f"{a} {rng.choice('+-*')} {b} {rng.choice('+-*')} {c}"
    raise ValueError(f"level={level!r} is not a known level; use one of {list(LEVELS)}")


_LAST_NUMBER = re.compile(r"-?\d[\d,]*")


@dataclass
class ArithmeticTask:
    """Arithmetic problems; answers are integers, scored by ``loomrl.reward.score``.

    ``eval_fraction`` of the problem space (by hash) is held out; ``eval_set()``
    draws ``eval_size`` distinct held-out problems with ``eval_seed``, independent
    of the training ``seed`` so runs with different seeds share the evaluation set.
    Level 1 has only 100 distinct problems, so its evaluation set is smaller.
    """

    name: ClassVar[str] = "arithmetic"

    level: int = 1
    seed: int = 0
    eval_size: int = 200
    eval_fraction: float = 0.2
    eval_seed: int = 0
    format_reward: float = 0.0
    # "boxed": only an explicit final answer counts; "last_number": when there is none, the last
    # number of the response is taken as the answer (lenient, for small models early in training).
    answer_format: str = "boxed"
    _eval: list[Example] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if self.level not in LEVELS or isinstance(self.level, bool):
            problems.append(f"level={self.level!r}: must be one of {list(LEVELS)}")
        if not 0.0 < self.eval_fraction < 1.0:
            problems.append(
                f"eval_fraction={self.eval_fraction!r}: must be in (0, 1); it is the share of "
                "problems held out for evaluation"
            )
        if not isinstance(self.eval_size, int) or self.eval_size < 1:
            problems.append(f"eval_size={self.eval_size!r}: must be an int >= 1")
        if not 0.0 <= self.format_reward < 1.0:
            problems.append(f"format_reward={self.format_reward!r}: must be in [0, 1)")
        if self.answer_format not in ("boxed", "last_number"):
            problems.append(
                f"answer_format={self.answer_format!r}: must be 'boxed' or 'last_number'"
            )
        if problems:
            raise ConfigError(problems, source="task 'arithmetic'")

    def _example(self, expr: str) -> Example:
        value = safe_eval(expr)
        return Example(
            question=f"What is {expr}?",
            answer=str(int(value)),
            meta={"level": self.level, "expression": expr},
        )

    def train_item(self, index: int) -> Example:
        check_index(index)
        rng = random.Random(f"arithmetic/{self.level}/{self.seed}/{index}")
        for _ in range(_MAX_DRAWS):
            expr = generate_expression(rng, self.level)
            if not in_eval_split(expr, self.eval_fraction):
                return self._example(expr)
        raise RuntimeError(
            f"arithmetic: no training problem found in {_MAX_DRAWS} draws; "
            f"eval_fraction={self.eval_fraction} leaves too little for training"
        )

    def eval_set(self) -> list[Example]:
        if self._eval is None:
            rng = random.Random(f"arithmetic-eval/{self.level}/{self.eval_seed}")
            seen: dict[str, None] = {}
            # Small problem spaces (level 1) run out of distinct held-out problems;
            # stop after a bounded number of draws instead of looping forever.
            for _ in range(max(_MAX_DRAWS, 20 * self.eval_size)):
                if len(seen) >= self.eval_size:
                    break
                expr = generate_expression(rng, self.level)
                if in_eval_split(expr, self.eval_fraction):
                    seen.setdefault(expr)
            self._eval = [self._example(e) for e in seen]
        return list(self._eval)

    def score(self, response_text: str, example: Example) -> RewardResult:
        res = score(response_text, example.answer, format_reward=self.format_reward)
        if res.malformed and self.answer_format == "last_number":
            nums = _LAST_NUMBER.findall(response_text[-2000:])
            if nums:
                ok = nums[-1].replace(",", "") == example.answer
                return RewardResult(
                    reward=1.0 if ok else 0.0,
                    parsed=nums[-1],
                    malformed=False,
                    correct=ok,
                    reason="last_number",
                )
        return res
