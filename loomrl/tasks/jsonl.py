"""Problems from local JSONL files: one JSON object per line with a prompt and an answer.

Any problem in the file is checked when it is loaded, and an error names the file
and the line. The held-out set is either a separate file (training lines with the
same prompt are dropped) or a hash-selected share of the training file.
Nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from loomrl.config import read_utf8
from loomrl.errors import ConfigError, LoomError
from loomrl.reward import RewardResult, score
from loomrl.tasks.base import Example, check_index, in_eval_split


class DatasetError(LoomError, ValueError):
    """A dataset file is missing or has an invalid line."""


def jsonl_lines(text: str) -> list[str]:
    r"""The lines of a JSON Lines text, split at ``\n`` only (a ``\r`` before it is JSON
    whitespace). Not ``str.splitlines``: that also splits at U+2028, U+2029, U+0085 and other
    separators, which JSON allows raw inside a string (``json.dumps(..., ensure_ascii=False)``
    writes them so), cutting a valid line in two and shifting every later line number."""
    return text.removeprefix("\ufeff").split("\n")  # a byte order mark is no part of line 1


def _no_constant(name: str) -> float:
    # NaN and Infinity are not JSON; Python's reader takes them unless told otherwise.
    raise ValueError(f"{name} is not a JSON value")


def load_jsonl(
    path: str | Path, prompt_key: str = "prompt", answer_key: str = "answer"
) -> list[Example]:
    """Read ``path``: each non-blank line a JSON object with ``prompt_key`` and ``answer_key``.

    The answer may be a string or a number (stored as its string). All other fields
    go to ``Example.meta``. Raises ``DatasetError`` naming the file and line number
    for invalid JSON, a non-object line, or a missing/empty prompt or answer.
    """
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset file {str(p)!r} does not exist (check the task's path)")
    examples: list[Example] = []
    try:
        text = read_utf8(p)
    except ValueError as e:
        where, byte = e.args
        raise DatasetError(f"{where}: not UTF-8 text ({byte}); save the file as UTF-8") from None
    for lineno, line in enumerate(jsonl_lines(text), start=1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            row = json.loads(line, parse_constant=_no_constant)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        except ValueError as e:
            raise DatasetError(f"{where}: invalid JSON ({e})") from None
        if not isinstance(row, dict):
            raise DatasetError(
                f"{where}: expected a JSON object like "
                f'{{"{prompt_key}": ..., "{answer_key}": ...}}, got {type(row).__name__}'
            )
        prompt, answer = row.get(prompt_key), row.get(answer_key)
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(
                f"{where}: missing or empty {prompt_key!r} (keys present: {sorted(row)}); "
                "set prompt_key if the question is stored under another name"
            )
        if isinstance(answer, float) and not math.isfinite(answer):  # 1e999 reads as inf
            raise DatasetError(
                f"{where}: {answer_key!r} is a number too large for a float "
                "(it reads as infinity); write it as a string"
            )
        if answer is None or isinstance(answer, (dict, list, bool)) or not str(answer).strip():
            raise DatasetError(
                f"{where}: missing or empty {answer_key!r} (keys present: {sorted(row)}); "
                "every line needs a string or number answer; set answer_key if it is "
                "stored under another name"
            )
        meta = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
        meta["source"] = where
        examples.append(Example(question=prompt, answer=str(answer).strip(), meta=meta))
    if not examples:
        raise DatasetError(f"dataset file {str(p)!r} has no examples")
    return examples


@dataclass
class JsonlTask:
    """Training from ``path``; evaluation from ``eval_path`` or a hash split of ``path``.

    Training order is a seeded permutation per epoch: ``train_item(i)`` is item
    ``i % n`` of the permutation of epoch ``i // n``.
    """

    name: ClassVar[str] = "jsonl"

    path: str = ""
    eval_path: str | None = None
    eval_fraction: float = 0.1
    eval_size: int | None = None
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    seed: int = 0
    format_reward: float = 0.0
    _train: list[Example] = field(default_factory=list, init=False, repr=False, compare=False)
    _eval: list[Example] = field(default_factory=list, init=False, repr=False, compare=False)
    _perm: tuple[int, list[int]] | None = field(default=None, init=False, repr=False, compare=False)
    overlap_dropped: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        problems = []
        if not self.path:
            problems.append("path: required (a local .jsonl file with prompt/answer lines)")
        if self.eval_path is None and not 0.0 < self.eval_fraction < 1.0:
            problems.append(
                f"eval_fraction={self.eval_fraction!r}: must be in (0, 1) when no eval_path is given"
            )
        if self.eval_size is not None and (
            not isinstance(self.eval_size, int) or self.eval_size < 1
        ):
            problems.append(f"eval_size={self.eval_size!r}: must be an int >= 1 or None (all)")
        if not 0.0 <= self.format_reward < 1.0:
            problems.append(f"format_reward={self.format_reward!r}: must be in [0, 1)")
        if problems:
            raise ConfigError(problems, source="task 'jsonl'")

        rows = load_jsonl(self.path, self.prompt_key, self.answer_key)
        if self.eval_path is not None:
            held_out = load_jsonl(self.eval_path, self.prompt_key, self.answer_key)
            held_prompts = {ex.question.strip() for ex in held_out}
            self._train = [ex for ex in rows if ex.question.strip() not in held_prompts]
            self.overlap_dropped = len(rows) - len(self._train)
            self._eval = held_out
        else:
            self._train, self._eval = [], []
            for ex in rows:
                target = (
                    self._eval
                    if in_eval_split(ex.question.strip(), self.eval_fraction)
                    else self._train
                )
                target.append(ex)
        if self.eval_size is not None:
            self._eval = self._eval[: self.eval_size]
        if not self._train:
            raise DatasetError(
                f"{self.path}: no training examples left after holding out the evaluation set "
                f"({len(rows)} lines, {len(self._eval)} held out); add data or lower eval_fraction"
            )

    def __len__(self) -> int:
        return len(self._train)

    def train_item(self, index: int) -> Example:
        check_index(index)
        n = len(self._train)
        epoch, pos = divmod(index, n)
        if self._perm is None or self._perm[0] != epoch:
            order = list(range(n))
            random.Random(f"jsonl/{self.seed}/{epoch}").shuffle(order)
            self._perm = (epoch, order)
        return self._train[self._perm[1][pos]]

    def eval_set(self) -> list[Example]:
        return list(self._eval)

    def score(self, response_text: str, example: Example) -> RewardResult:
        return score(response_text, example.answer, format_reward=self.format_reward)
