"""Countdown: combine the given numbers with + - * / to reach a target.

Every generated problem is solvable: the target is the value of a random
expression over a subset of the numbers (kept as ``meta["solution"]``). A response
is correct when its final answer is an expression that uses each given number at
most once (as a multiset) and evaluates exactly to the target. Expressions are
checked with ``ast`` (see ``loomrl.tasks.expr``), never with ``eval``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import ClassVar

from loomrl.errors import ConfigError
from loomrl.reward import RewardResult, extract_answer
from loomrl.tasks.base import Example, check_index, in_eval_split
from loomrl.tasks.expr import ExprError, evaluate, literals, parse_expression

_MAX_DRAWS = 10_000


def check_solution(expression: str, numbers: list[int], target: int) -> tuple[bool, str]:
    """Whether ``expression`` solves the problem: (ok, reason).

    reason is ``correct``, ``unparseable`` (not an expression of integers and + - * /),
    ``number_not_available`` (uses a number not given, or more often than given),
    ``division_by_zero`` or ``wrong`` (valid but another value).
    """
    try:
        tree = parse_expression(expression)
    except ExprError:
        return False, "unparseable"
    available = Counter(numbers)
    used = Counter(literals(tree))
    if any(count > available[n] for n, count in used.items()):
        return False, "number_not_available"
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        return False, "division_by_zero"
    return (True, "correct") if value == target else (False, "wrong")


def _random_solution(rng: random.Random, numbers: list[int]) -> tuple[str, Fraction] | None:
    """A random expression over a random subset (>= 2) of ``numbers`` and its value."""
    k = rng.randint(2, len(numbers))
    chosen = rng.sample(numbers, k)
    expr, value = str(chosen[0]), Fraction(chosen[0])
    for n in chosen[1:]:
        inner = f"({expr})" if " " in expr else expr
        op = rng.choice("+-*/")
        if op == "+":
            expr, value = f"{expr} + {n}", value + n
        elif op == "-":
            # Subtract the smaller from the larger so partial results stay positive.
            if value >= n:
                expr, value = f"{expr} - {n}", value - n
            else:
                expr, value = f"{n} - {inner}", n - value
        elif op == "*":
            expr, value = f"{inner} * {n}", value * n
        else:
            if n == 0 or (value / n).denominator != 1:
                return None
            expr, value = f"{inner} / {n}", value / n
    return expr, value


@dataclass
class CountdownTask:
    """Countdown problems with ``num_numbers`` numbers in [1, max_number] and a target in [1, max_target]."""

    name: ClassVar[str] = "countdown"

    num_numbers: int = 4
    max_number: int = 50
    max_target: int = 100
    seed: int = 0
    eval_size: int = 200
    eval_fraction: float = 0.1
    eval_seed: int = 0
    format_reward: float = 0.0
    _eval: list[Example] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.num_numbers, int) or not 2 <= self.num_numbers <= 6:
            problems.append(f"num_numbers={self.num_numbers!r}: must be an int in [2, 6]")
        if not isinstance(self.max_number, int) or self.max_number < 2:
            problems.append(f"max_number={self.max_number!r}: must be an int >= 2")
        if not isinstance(self.max_target, int) or self.max_target < 1:
            problems.append(f"max_target={self.max_target!r}: must be an int >= 1")
        if not 0.0 < self.eval_fraction < 1.0:
            problems.append(f"eval_fraction={self.eval_fraction!r}: must be in (0, 1)")
        if not isinstance(self.eval_size, int) or self.eval_size < 1:
            problems.append(f"eval_size={self.eval_size!r}: must be an int >= 1")
        if not 0.0 <= self.format_reward < 1.0:
            problems.append(f"format_reward={self.format_reward!r}: must be in [0, 1)")
        if problems:
            raise ConfigError(problems, source="task 'countdown'")

    def _draw(self, rng: random.Random) -> Example:
        for _ in range(_MAX_DRAWS):
            numbers = [rng.randint(1, self.max_number) for _ in range(self.num_numbers)]
            sol = _random_solution(rng, numbers)
            if sol is None:
                continue
            expr, value = sol
            if value.denominator == 1 and 1 <= value <= self.max_target:
                target = int(value)
                listed = ", ".join(str(n) for n in numbers)
                question = (
                    f"Using the numbers [{listed}], write an arithmetic expression that equals "
                    f"{target}. You may use +, -, * and / and parentheses, and each number at "
                    "most once. Give the expression as your final answer."
                )
                return Example(
                    question=question,
                    answer=str(target),
                    meta={"numbers": numbers, "target": target, "solution": expr},
                )
        raise RuntimeError(
            f"countdown: could not generate a problem with max_number={self.max_number} "
            f"and max_target={self.max_target}; raise max_target"
        )

    @staticmethod
    def _key(ex: Example) -> str:
        return f"{sorted(ex.meta['numbers'])}->{ex.meta['target']}"

    def train_item(self, index: int) -> Example:
        check_index(index)
        rng = random.Random(f"countdown/{self.num_numbers}/{self.seed}/{index}")
        for _ in range(_MAX_DRAWS):
            ex = self._draw(rng)
            if not in_eval_split(self._key(ex), self.eval_fraction):
                return ex
        raise RuntimeError(
            f"countdown: eval_fraction={self.eval_fraction} leaves no training problems"
        )

    def eval_set(self) -> list[Example]:
        if self._eval is None:
            rng = random.Random(f"countdown-eval/{self.num_numbers}/{self.eval_seed}")
            found: dict[str, Example] = {}
            for _ in range(max(_MAX_DRAWS, 20 * self.eval_size)):
                if len(found) >= self.eval_size:
                    break
                ex = self._draw(rng)
                key = self._key(ex)
                if in_eval_split(key, self.eval_fraction):
                    found.setdefault(key, ex)
            self._eval = list(found.values())
        return list(self._eval)

    def score(self, response_text: str, example: Example) -> RewardResult:
        parsed = extract_answer(response_text) if isinstance(response_text, str) else None
        if parsed is None:
            return RewardResult(0.0, None, True, False, "no_answer")
        ok, reason = check_solution(parsed, example.meta["numbers"], example.meta["target"])
        if ok:
            return RewardResult(1.0, parsed, False, True, "correct")
        if reason == "unparseable":
            return RewardResult(0.0, parsed, True, False, reason)
        return RewardResult(self.format_reward, parsed, False, False, reason)
