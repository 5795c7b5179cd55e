"""Named verbs of the reasoning recipes (kept out of the driver loop so it fits on one screen)."""

from __future__ import annotations

from typing import Any

from loomrl.tasks.base import score_checked
from loomrl.worker import wait


class Encoder:
    """Chat-template prompt encoding in the driver (tokenizer only, no model). The prompt ends
    with ``response_prefix`` (the start of the model's reply, e.g. an agent's ``<search>``)."""

    def __init__(self, model_path: str, instruction: str = "think", response_prefix: str = ""):
        self.instruction = instruction
        from transformers import AutoTokenizer

        from loomrl.models import resolve_model
        from loomrl.workers.reasoning import model_dir

        path = resolve_model(model_dir(model_path))
        try:
            self.tok = AutoTokenizer.from_pretrained(str(path))
        except Exception as e:  # noqa: BLE001 - transformers' and tokenizers' errors vary
            from loomrl.errors import ConfigError

            cause = (str(e).strip().splitlines() or [""])[0][:200]
            raise ConfigError(
                [
                    f"model.path: the tokenizer of {model_path!r} cannot be loaded "
                    f"({type(e).__name__}: {cause}); give a model directory whose tokenizer "
                    "files (tokenizer.json, tokenizer_config.json) load with AutoTokenizer"
                ]
            ) from None
        self.prefix_ids = (
            self.tok.encode(response_prefix, add_special_tokens=False) if response_prefix else []
        )
        from loomrl.models import model_context_window

        # Read from config.json (no model loaded): what check_context holds prompts against.
        self.window = model_context_window(path)

    def __call__(self, question: str) -> list[int]:
        from loomrl.tasks.prompts import build_messages

        if not getattr(self.tok, "chat_template", None):
            from loomrl.errors import ConfigError

            raise ConfigError(
                [
                    "the tokenizer has no chat template: set one in the model directory "
                    "(tokenizer_config.json 'chat_template')"
                ]
            )
        ids = self.tok.apply_chat_template(
            build_messages(question, instruction=self.instruction),
            add_generation_prompt=True,
            tokenize=True,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(x) for x in ids] + self.prefix_ids


# Training items measured where a task does not say how many it has (generated problems, whose
# lengths vary little); a task with ``len()`` (a JSONL file) has every one measured.
_SAMPLED_ITEMS = 256
# The questions, longest in characters first, that are tokenized: token counts follow character
# counts closely, and the engine still refuses a longer prompt the sample missed.
_MEASURED_PROMPTS = 16


def sampling_budgets(sampling: Any) -> dict[str, int]:
    """The response budgets of a ``SamplingConfig``, by config key, for ``check_context``."""
    return {
        "sampling.max_new_tokens": sampling.max_new_tokens,
        "sampling.eval_max_new_tokens": sampling.eval_max_new_tokens,
    }


def check_context(task: Any, encode: Encoder, budgets: dict[str, int]) -> None:
    """Refuse, before any worker starts, a response budget (``budgets``: config key -> tokens)
    that with the task's longest prompt passes the model's context window: past it generation
    fails deep in torch (learned positions), asserts on CUDA, or samples on untrained
    positions without a word (RoPE)."""
    if encode.window is None:
        return
    count = len(task) if hasattr(task, "__len__") else _SAMPLED_ITEMS
    questions = {e.question for e in task.eval_set()}
    questions.update(task.train_item(i).question for i in range(count))
    longest_texts = sorted(questions, key=len, reverse=True)[:_MEASURED_PROMPTS]
    longest = max(len(encode(q)) for q in longest_texts)
    room = encode.window - longest
    fix = (
        "use shorter prompts or a model with a longer window"
        if room < 1
        else f"set {{key}} to at most {room} or use shorter prompts"
    )
    problems = [
        f"{key}={n}: with the task's longest prompt ({longest} tokens) a response reaches "
        f"{longest + n} positions, past the model's context window of {encode.window} "
        f"(config.json of model.path); " + fix.format(key=key)
        for key, n in budgets.items()
        if longest + n > encode.window
    ]
    if problems:
        from loomrl.errors import ConfigError

        raise ConfigError(problems)


PACKAGED_MODELS = ("smollm2-135m-instruct", "tiny-llama", "tiny-qwen2")


def common_problems(cfg: Any, min_group: int) -> list[str]:
    """Checks every reasoning recipe's config shares: batch, group size, generation chunks, model."""
    from pathlib import Path

    p = cfg.run.flow_problems()
    if cfg.batch < 1:
        p.append(f"batch: must be >= 1 prompt group, got {cfg.batch}")
    if cfg.eval_every < 0:
        p.append(
            f"eval_every: must be >= 0 steps (0: only before and after training), got {cfg.eval_every}"
        )
    if cfg.sampling.group_size < min_group:
        p.append(
            f"sampling.group_size: must be >= {min_group} responses per prompt, "
            f"got {cfg.sampling.group_size}"
        )
    if cfg.sampling.gen_groups >= 1 and (
        cfg.batch % cfg.sampling.gen_groups and cfg.batch > cfg.sampling.gen_groups
    ):
        p.append(
            f"batch={cfg.batch} is not a multiple of sampling.gen_groups={cfg.sampling.gen_groups}"
        )
    if cfg.model.path not in PACKAGED_MODELS:
        from loomrl.models import model_dir_problem

        if not Path(cfg.model.path).exists():
            p.append(
                f"model.path: {cfg.model.path!r} does not exist (a local Hugging Face model "
                f"directory or one of {list(PACKAGED_MODELS)})"
            )
        elif (problem := model_dir_problem(cfg.model.path)) is not None:
            p.append(f"model.path: {problem}")
    return p


def prompts(task: Any, encode: Any, step: int, batch: int) -> list[dict]:
    """One iteration's work items: ``batch`` prompt groups, numbered within the batch."""
    items = []
    for i in range(batch):
        ex = task.train_item(step * batch + i)
        items.append(
            {
                "index": i,
                "step": step,
                "question": ex.question,
                "answer": ex.answer,
                "meta": ex.meta,
                "prompt_ids": encode(ex.question),
            }
        )
    return items


def weight_sync(source: Any, *sinks: Any, cfg: Any = None) -> Any:
    """The trainer -> users weight push (``loomrl.weights.WeightSync``: CUDA IPC, shared memory,
    NCCL or Gloo per receiving rank), with the run's bucket size and route."""
    from loomrl.weights import WeightSync

    return WeightSync(
        source,
        *sinks,
        bucket_mb=getattr(cfg, "weight_bucket_mb", 256),
        path=getattr(cfg, "weight_path", "auto"),
    )


def evaluate(rollout: Any, task: Any, encode: Encoder, cfg: Any) -> float:
    """Held-out accuracy: the share of the eval set answered correctly (greedy)."""
    scores = [score for _, score in eval_scores(rollout, task, encode, cfg)]
    return sum(scores) / max(1, len(scores))


def eval_scores(rollout: Any, task: Any, encode: Encoder, cfg: Any) -> list[tuple[Any, float]]:
    """Each held-out example with its score (1.0 correct, else 0.0)."""
    exs = task.eval_set()[: cfg.task.eval_size]
    items = [
        {"question": e.question, "answer": e.answer, "prompt_ids": encode(e.question)} for e in exs
    ]
    texts = [t for rank in wait(rollout.evaluate(items)) for t in rank]
    return [
        (e, 1.0 if score_checked(task, t, e).reward >= 1.0 else 0.0)
        for t, e in zip(texts, exs, strict=True)
    ]


def metrics_of(result: Any, *syncs: Any) -> dict[str, float]:
    groups = [o for o in result.outputs]
    stats = groups[-1] if groups else {}
    m: dict[str, float] = {
        k: float(v) for k, v in stats.items() if k != "index" and isinstance(v, (int, float))
    }
    m["iteration_s"] = result.measured_s
    if "gen_tokens" in m:
        m["tokens_per_s"] = m["gen_tokens"] / max(result.measured_s, 1e-9)
    m["predicted_s"] = result.predicted_s
    for comp, secs in result.stage_seconds().items():
        m[f"time/{comp}"] = secs
    done = [s.last for s in syncs if s.last is not None]
    if done:
        m["time/weight_sync"] = sum(r.seconds for r in done)
    return m


def save(run: Any, groups: dict, step: int) -> None:
    from loomrl.checkpoint import capture_rng, save_checkpoint

    state = wait(groups["actor"].save_state())[0]
    save_checkpoint(
        run.dir,
        step,
        {"actor": state, "step": step, "rng": capture_rng()},
        keep=run.rc.keep_checkpoints,
    )


def fresh_start(run: Any) -> int:
    """Step 0 of a run that does not resume: an earlier run's checkpoints in the same directory
    are set aside first (``checkpoint.set_aside``), so a restart of this run cannot load them."""
    from loomrl.checkpoint import set_aside

    moved = set_aside(run.dir)
    if moved is not None:
        run.logger.echo(f"an earlier run's checkpoints moved to {moved} (resume=false)")
    return 0


def opening_metrics(run: Any, start: int, steps: int, measure: Any) -> dict[str, Any]:
    """The metrics a run starts from (``measure()`` evaluates them). A fresh run measures and
    logs them, the curve's first point; a resumed one logged its checkpoint's step already and
    starts from none. A restart after the last checkpoint has no step left to run: its summary
    takes the row it logged for that step, not a second row of it (measured and logged only
    where that row is missing)."""
    if not opening_eval(start, steps):
        return {}
    if start > 0:
        from loomrl.runlog import _RESERVED, read_metrics

        try:
            rows = [r for r in read_metrics(run.dir) if r.get("step") == start]
        except FileNotFoundError:
            rows = []
        if rows:
            return {k: v for k, v in rows[-1].items() if k not in _RESERVED}
    metrics = measure()
    run.logger.log(start, metrics)
    return metrics


def opening_eval(start: int, steps: int) -> bool:
    """Whether a run evaluates before its first step: a fresh one does (the curve's first
    point), a resumed one not, as its checkpoint's step was logged already, unless it has no
    step left to run (its summary then needs the metric)."""
    return start == 0 or start >= steps


def restore(run: Any, groups: dict) -> int:
    from loomrl.checkpoint import latest_checkpoint, load_checkpoint, restore_rng

    path = latest_checkpoint(run.dir)
    if path is None:
        return 0
    state = load_checkpoint(path, weights_only=False)
    wait(groups["actor"].load_state(state["actor"]))
    restore_rng(state["rng"])
    run.steps_done = int(state["step"])
    return run.steps_done
