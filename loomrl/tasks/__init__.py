"""Tasks: where problems come from and how answers are scored.

``make_task("arithmetic", level=2)`` builds a task from its name and options.
Tasks import neither torch nor a tokenizer; prompts are rendered by
``loomrl.tasks.prompts``.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any

from loomrl.errors import ConfigError
from loomrl.tasks.arithmetic import ArithmeticTask
from loomrl.tasks.base import Example, Task, in_eval_split
from loomrl.tasks.countdown import CountdownTask, check_solution
from loomrl.tasks.digits import DigitsTask
from loomrl.tasks.jsonl import DatasetError, JsonlTask, load_jsonl
from loomrl.tasks.prompts import build_messages, plain_prompt, render_prompt
from loomrl.tasks.search_qa import SearchQATask

_REGISTRY: dict[str, type] = {
    "digits": DigitsTask,
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "jsonl": JsonlTask,
    "search_qa": SearchQATask,
}


def register_task(name: str, cls: type) -> None:
    """Make ``cls`` (a dataclass implementing ``Task``) available to ``make_task(name)``."""
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"task name {name!r} is already registered to {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def task_options(name: str) -> list[str] | None:
    """The keyword options task ``name`` takes; None where they cannot be told (a class whose
    constructor takes ``**kwargs``)."""
    cls = _REGISTRY[name]
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def make_task(name: str, **kwargs: Any) -> Task:
    """Build the task called ``name`` with its options; unknown names or options raise ConfigError."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ConfigError(
            f"task name {name!r} is not known{_did_you_mean(str(name), task_names())}. "
            f"Known tasks: {', '.join(task_names())}"
        )
    if dataclasses.is_dataclass(cls):
        valid = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = [k for k in kwargs if k not in valid]
        if unknown:
            raise ConfigError(
                [
                    f"option {k!r} is not known for task {name!r}{_did_you_mean(k, valid)}. "
                    f"Valid options: {', '.join(valid)}"
                    for k in unknown
                ],
                source=f"task {name!r}",
            )
    return cls(**kwargs)


__all__ = [
    "ArithmeticTask",
    "CountdownTask",
    "DatasetError",
    "Example",
    "JsonlTask",
    "SearchQATask",
    "Task",
    "build_messages",
    "check_solution",
    "in_eval_split",
    "load_jsonl",
    "make_task",
    "plain_prompt",
    "register_task",
    "render_prompt",
    "task_names",
    "task_options",
]
