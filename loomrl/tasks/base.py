"""What a task is: examples, the ``Task`` protocol and the held-out split.

A task hands out training examples by index (deterministic, so any worker can
produce item i without coordination), a fixed evaluation set, and a scorer.
Tasks know nothing about tokenizers or models; prompts are rendered by
``loomrl.tasks.prompts``.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from loomrl.errors import TrainingError
from loomrl.reward import RewardResult


@dataclass(frozen=True)
class Example:
    """One problem: the question shown to the model, its reference answer, extra data."""

    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    name: str

    def train_item(self, index: int) -> Example:
        """Training example number ``index`` (any int >= 0; the same index gives the same example)."""
        ...

    def eval_set(self) -> list[Example]:
        """The fixed held-out examples; none of them is ever returned by ``train_item``."""
        ...

    def score(self, response_text: str, example: Example) -> RewardResult:
        """Reward of a model response to ``example``; never raises on model output."""
        ...


def score_checked(task: Task, response_text: str, example: Example) -> RewardResult:
    """``task.score`` held to its contract. Model output is never the scorer's excuse to raise
    (malformed output is a ``RewardResult`` with ``malformed=True``), so a scorer that raises,
    or returns anything but a ``RewardResult`` with a finite reward, has a bug: a
    ``TrainingError`` naming the task, the example and the response, not a bare ``KeyError``
    from deep in a worker, or a NaN that poisons every advantage of its group."""

    def where() -> str:  # built for an error only: this runs on every response of a run
        name = getattr(task, "name", type(task).__name__)
        return (
            f"task {name!r} score() on the example {_excerpt(example.question)} "
            f"(answer {_excerpt(example.answer)}) and the response {_excerpt(response_text)}"
        )

    try:
        res = task.score(response_text, example)
    except Exception as e:  # noqa: BLE001 - any exception is the task's bug; say whose
        raise TrainingError(
            f"{where()} raised {type(e).__name__}: {e} — a scorer returns a RewardResult for any "
            "response (malformed=True when it has no usable answer); fix the task's score()"
        ) from e
    if not isinstance(res, RewardResult):
        raise TrainingError(
            f"{where()} returned {type(res).__name__} {repr(res)[:80]}, not a RewardResult — "
            "return loomrl.reward.RewardResult(reward, parsed, malformed, ...)"
        )
    # numbers.Real, not (int, float): a reward computed with numpy (np.float32, np.int64) is
    # a number too, and torch.tensor takes it.
    if (
        isinstance(res.reward, bool)
        or not isinstance(res.reward, numbers.Real)
        or not math.isfinite(res.reward)
    ):
        raise TrainingError(
            f"{where()} returned reward={res.reward!r} — a reward must be a finite number"
        )
    return res


def _excerpt(text: Any, limit: int = 80) -> str:
    text = str(text)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


_SPLIT_SALT = b"loomrl-heldout-v1"


def in_eval_split(key: str, eval_fraction: float) -> bool:
    """Whether the problem identified by ``key`` belongs to the held-out split.

    A pure function of the key (a hash), not of any seed: the split is the same in
    every run and every process, so evaluation problems can never leak into training.
    """
    digest = hashlib.sha256(_SPLIT_SALT + b"\0" + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < eval_fraction


def check_index(index: int) -> None:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"train_item index must be an int >= 0; got {index!r}")
