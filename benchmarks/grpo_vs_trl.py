"""GRPO step speed: loomrl's GRPO recipe beside TRL's GRPOTrainer on the same model and prompts.

Run:  python benchmarks/grpo_vs_trl.py --model smollm2-135m-instruct --batch 4 --group-size 8 \\
          --max-new-tokens 32 --steps 3 --out runs/bench_grpo_vs_trl.json
      (about 10 minutes on 2 CPU cores)

Both sides run one after the other, each in its own subprocess (so Ray, threads and memory of one
never touch the other), with the same settings:
  model           --model: 'smollm2-135m-instruct', 'tiny-llama', a local HF directory, or
                  'random-smollm2-135m' / 'random-0.5b' (random weights of that shape, written once
                  with loomrl.models.random_model_like: for machines the GGUF cannot reach)
  prompts         the arithmetic task's train items 0.., as loomrl's chat messages (--instruction),
                  rendered with the model's chat template (token ids checked equal)
  a step          --batch prompts x --group-size responses (at most --max-new-tokens each),
                  rewards from loomrl.tasks' arithmetic scorer, one GRPO update, group-normalised
                  advantages, clip 0.2 / 0.28, token-mean loss, no gradient checkpointing
  also equal      learning rate, beta (KL coefficient; 0 = no reference model), temperature,
                  training micro-batch (--train-micro-batch sequences per forward/backward)
  precision       --precision auto: fp32 on CPU; on CUDA fp32 weights with bf16 autocast on both
                  sides (loomrl's rollout engine, an inference copy, holds bf16 weights).
                  --precision bf16 applies the CUDA scheme on CPU too (TRL: bf16=True, CPU
                  autocast), --precision fp32 keeps everything fp32 everywhere

loomrl runs ``loomrl.recipes.reasoning_grpo`` with ``placement=temporal``: the planner profiles the
components first (``--loomrl-plan profile``, the default) or, with ``--loomrl-plan calibrate``,
starts from the default temporal plan and takes its costs from the warm-up iteration; profiling
time is reported apart and is not in the per-step numbers. A loomrl step is one flow iteration
(``run_summary.json``'s ``iteration_s``: generate -> reward -> train) plus the weight push to the
rollout workers that follows it (the logged ``time/weight_sync``): TRL generates with the model it
trains and has no such push, so loomrl's throughput counts it. ``--offload never`` keeps every
component resident on its device (``run.offload``; default ``auto``).

TRL's step time is the wall time between optimizer-step ends (generation, reward, update,
logging); its generated tokens are counted from the completions its reward function saw.

For each side: seconds per step (median over the measured steps; the first ``--warmup`` steps are
dropped) and generated tokens per second (generated tokens per step / seconds per step).
The last line printed is ``ratio: <loomrl tokens/s / TRL tokens/s>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENV = {"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
for _k, _v in ENV.items():
    os.environ.setdefault(_k, _v)

# Clip range and advantage scaling of loomrl's AlgoConfig defaults; TRL is told the same.
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
RANDOM_PREFIX = "random-"


# ----------------------------------------------------------------------------- shared helpers
def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        with open("/proc/loadavg") as f:
            return "load average: " + ", ".join(f.read().split()[:3])


def load_average() -> list[float]:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def resolve_model_dir(spec: str) -> str:
    """A local HF directory for ``spec`` (converted SmolLM2, the tiny test model, a random model
    of a known shape, or a directory given as is)."""
    from loomrl.models import cache_root, random_model_like, resolve_model
    from loomrl.workers.reasoning import model_dir

    if spec.startswith(RANDOM_PREFIX):
        name = spec[len(RANDOM_PREFIX) :]
        d = cache_root() / f"random-{name}"
        if not (d / "config.json").exists():
            random_model_like(d, config_name=name)
        return str(d)
    return str(resolve_model(model_dir(spec)))


def task_config(spec: dict) -> dict:
    """The recipe's task section; ``instruction`` only where this loomrl version has that key."""
    import dataclasses

    from loomrl.workers.reasoning import TaskConfig

    t = {"name": "arithmetic", "level": spec["level"], "eval_size": spec["batch"]}
    if "instruction" in {f.name for f in dataclasses.fields(TaskConfig)}:
        t["instruction"] = spec["instruction"]
    return t


def messages(question: str, instruction: str) -> list[dict]:
    """The chat messages loomrl's Encoder renders for ``question`` (same instruction)."""
    import inspect

    from loomrl.tasks import build_messages

    if "instruction" in inspect.signature(build_messages).parameters:
        return build_messages(question, instruction=instruction)
    return build_messages(question)


def prompt_items(level: int, seed: int, n: int) -> list[dict]:
    """The first ``n`` train items of the arithmetic task: loomrl's step s uses items s*batch..."""
    from loomrl.tasks import make_task

    task = make_task("arithmetic", level=level, seed=seed)
    return [
        {"question": ex.question, "answer": ex.answer}
        for ex in (task.train_item(i) for i in range(n))
    ]


# ----------------------------------------------------------------------------- loomrl side
def loomrl_config(spec: dict, model_dir: str, out_dir: str) -> dict:
    total = spec["warmup"] + spec["steps"]
    return {
        "recipe": "grpo",
        "batch": spec["batch"],
        "eval_every": 0,
        "model": {
            "path": model_dir,
            "dtype": {"auto": "auto", "bf16": "bfloat16", "fp32": "float32"}[
                spec.get("precision", "auto")
            ],
            "lr": spec["lr"],
            "grad_clip": 1.0,
            "train_micro_batch": spec["train_micro_batch"],
        },
        "sampling": {
            "group_size": spec["group_size"],
            "max_new_tokens": spec["max_new_tokens"],
            "temperature": spec["temperature"],
            "top_p": 1.0,
            # TRL generates the whole step's prompts as one padded batch; so does loomrl here.
            "gen_groups": spec["batch"],
            "eval_max_new_tokens": spec["max_new_tokens"],
        },
        "algo": {
            "advantage": "grpo",
            "clip_low": CLIP_LOW,
            "clip_high": CLIP_HIGH,
            "kl_coef": spec["beta"],
            "agg": "token-mean",
        },
        # The recipe evaluates before and after training (outside the timed iterations); keep it small.
        "task": task_config(spec),
        "run": {
            "placement": "temporal",
            # "calibrate": no profiling; the first (warm-up) iteration measures the costs.
            **({"profile": "calibrate"} if spec["loomrl_plan"] == "calibrate" else {}),
            "steps": total,
            "seed": spec["seed"],
            "output_dir": out_dir,
            "tensorboard": False,
            "progress": False,
            "checkpoint_every": 0,
            "keep_checkpoints": 1,
            "offload": spec.get("offload", "auto"),
        },
    }


def phase_seconds(timeline: Path, warmup: int) -> dict[str, float]:
    """Median over the measured iterations of each component's onload / run / offload seconds
    (summed over ranks and micro-batches): where an iteration's time goes."""
    per_step: list[dict[str, float]] = []
    if not timeline.exists():
        return {}
    for line in timeline.read_text().splitlines()[warmup:]:
        acc: dict[str, float] = {}
        for r in json.loads(line).get("records", []):
            key = f"{r['component']}/{r['kind']}"
            acc[key] = acc.get(key, 0.0) + float(r["end"]) - float(r["start"])
        per_step.append(acc)
    keys = sorted({k for s in per_step for k in s})
    return {k: statistics.median(s.get(k, 0.0) for s in per_step) for k in keys}


def run_loomrl_side(spec: dict) -> dict:
    """In the child process: run the recipe in-process, read back its run directory."""
    import yaml

    from loomrl.cli import load_recipe_config

    model_dir = resolve_model_dir(spec["model"])
    out_dir = Path(spec["workdir"]) / "loomrl_run"
    cfg_path = Path(spec["workdir"]) / "loomrl_grpo.yaml"
    cfg_path.write_text(
        yaml.safe_dump(loomrl_config(spec, model_dir, str(out_dir)), sort_keys=False)
    )
    mod, cfg = load_recipe_config(cfg_path, [])
    t0 = time.perf_counter()
    summary = mod.main(cfg)
    wall = time.perf_counter() - t0

    w = spec["warmup"]
    iter_s = [float(x) for x in summary["iteration_s"]]
    rows = [
        json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line
    ]
    steps = sorted((r for r in rows if "iteration_s" in r), key=lambda r: r["step"])
    gen_tokens = [float(r.get("gen_tokens", float("nan"))) for r in steps]
    # Logged step k (1-based) follows flow iteration k-1 and its weight sync.
    sync = [float(r.get("time/weight_sync", float("nan"))) for r in steps]
    full = [i + s_ for i, s_ in zip(iter_s, sync, strict=False)]
    s_iter = median(iter_s[w:])
    s_step = median(full[w:])
    tok = median(gen_tokens[w:])
    sync_s = median(sync[w:])
    return {
        "phase_s": phase_seconds(out_dir / "timeline.jsonl", w),
        "name": "loomrl",
        "s_per_step": s_step,
        "gen_tokens_per_step": tok,
        "tokens_per_s": tok / s_step if s_step and tok is not None else None,
        "iteration_s": iter_s,
        "step_s": full,
        "gen_tokens": gen_tokens,
        "weight_sync_s": sync_s,
        "weight_sync_all_s": sync,
        "s_per_iteration_excl_sync": s_iter,
        "plan": summary.get("plan"),
        "predicted_iteration_s": summary.get("predicted_iteration_s"),
        "reward_mean": [r.get("reward_mean") for r in steps],
        "stage_s": {
            k: v for k, v in (summary.get("metrics") or {}).items() if k.startswith("time/")
        },
        "wall_s": wall,
        "run_dir": str(out_dir),
    }


# ----------------------------------------------------------------------------- TRL side
def run_trl_side(spec: dict) -> dict:
    """In the child process: GRPOTrainer on the same prompts, reward and settings."""
    import resource

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from loomrl.tasks import Example, make_task

    model_dir = resolve_model_dir(spec["model"])
    B, G, w = spec["batch"], spec["group_size"], spec["warmup"]
    total = w + spec["steps"]
    cuda = spec["device"] == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    rows = [
        {
            "prompt": messages(it["question"], spec["instruction"]),
            "question": it["question"],
            "answer": it["answer"],
        }
        for it in prompt_items(spec["level"], spec["seed"], B * total)
    ]
    dataset = Dataset.from_list(rows)
    task = make_task("arithmetic", level=spec["level"], seed=spec["seed"])
    seen: list[dict] = []  # one entry per reward call = one generation batch = one step here

    def arithmetic_reward(
        prompts, completions, completion_ids, question, answer, **_: Any
    ) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        seen.append(
            {
                "time": time.perf_counter(),
                "completions": len(texts),
                "tokens": sum(len(ids) for ids in completion_ids),
            }
        )
        return [
            task.score(t, Example(q, a, {})).reward
            for t, q, a in zip(texts, question, answer, strict=True)
        ]

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.begin: float | None = None
            self.ends: list[float] = []

        def on_train_begin(self, args, state, control, **kw):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

    n = B * G
    micro = spec["train_micro_batch"] if n % spec["train_micro_batch"] == 0 else n
    args = GRPOConfig(
        output_dir=str(Path(spec["workdir"]) / "trl_run"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=n // micro,
        generation_batch_size=n,  # one generation of B prompts x G per optimizer step
        num_generations=G,
        max_completion_length=spec["max_new_tokens"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        weight_decay=0.0,
        beta=spec["beta"],
        num_iterations=1,
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        scale_rewards="group",
        loss_type="dapo",  # token mean over the step's batch, as loomrl's token-mean
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        gradient_checkpointing=False,  # loomrl does not checkpoint either
        bf16=spec.get("precision", "auto") == "bf16" or (cuda and spec.get("precision") != "fp32"),
        use_cpu=not cuda,
        model_init_kwargs={"dtype": "float32"},
        shuffle_dataset=False,  # same prompt order as loomrl
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        max_steps=total,
        seed=spec["seed"],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    t_load = time.perf_counter()
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=arithmetic_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    load_s = time.perf_counter() - t_load
    cb = StepTimes()
    trainer.add_callback(cb)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0

    marks = [cb.begin, *cb.ends]
    step_s = [b - a for a, b in zip(marks[:-1], marks[1:], strict=True)]
    tokens = [float(s["tokens"]) for s in seen]
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    s_step = median(step_s[w:])
    tok = median(tokens[w:])
    return {
        "name": "trl",
        "s_per_step": s_step,
        "gen_tokens_per_step": tok,
        "tokens_per_s": tok / s_step if s_step and tok is not None else None,
        "iteration_s": step_s,
        "gen_tokens": tokens,
        "logged_mean_length": [h["completions/mean_length"] for h in logs],
        "reward_mean": [h.get("reward") for h in logs],
        "completions_per_step": [s["completions"] for s in seen],
        "micro_batch": micro,
        "gradient_accumulation_steps": n // micro,
        "torch_threads": torch.get_num_threads(),
        "setup_s": load_s,
        "wall_s": wall,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


# ----------------------------------------------------------------------------- driver
def run_child(side: str, spec: dict, timeout: float) -> tuple[dict | None, str, float]:
    """Run one side in a fresh interpreter; stream its output to stderr; return (result, log, s)."""
    result_path = Path(spec["workdir"]) / f"{side}_result.json"
    spec_path = Path(spec["workdir"]) / f"{side}_spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--side",
        side,
        "--spec",
        str(spec_path),
        "--result",
        str(result_path),
    ]
    env = {**os.environ, **ENV}
    lines: list[str] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            sys.stderr.write(f"[{side}] {line}")
            if time.perf_counter() - t0 > timeout:
                raise subprocess.TimeoutExpired(cmd, timeout)
        proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        lines.append(f"timed out after {timeout:.0f} s\n")
    took = time.perf_counter() - t0
    log = "".join(lines)
    if proc.returncode != 0 or not result_path.exists():
        return None, log, took
    return json.loads(result_path.read_text()), log, took


def profiling_seconds(log: str) -> float | None:
    """The plan line of a loomrl run: 'plan (12.3s incl. profiling):', or 'incl. starting the
    workers' where nothing was profiled (profile=calibrate, a plan file)."""
    m = re.search(r"plan \(([0-9.]+)s incl\. (?:profiling|starting the workers)\)", log)
    return float(m.group(1)) if m else None


def fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(res: dict) -> None:
    cols = ("side", "s/step", "gen tok/step", "gen tok/s", "sync s", "steps (s)")
    print(f"{cols[0]:<8}{cols[1]:>9}{cols[2]:>14}{cols[3]:>11}{cols[4]:>9}  {cols[5]}")
    for name in ("loomrl", "trl"):
        r = res.get(name) or {}
        steps = " ".join(fmt(x, ".2f") for x in r.get("step_s", r.get("iteration_s", [])))
        print(
            f"{name:<8}{fmt(r.get('s_per_step')):>9}{fmt(r.get('gen_tokens_per_step'), '.0f'):>14}"
            f"{fmt(r.get('tokens_per_s'), '.1f'):>11}{fmt(r.get('weight_sync_s'), '.3f'):>9}  {steps}"
        )
    lo = res.get("loomrl") or {}
    if lo:
        print(
            f"loomrl profiling (planning, not in s/step): {fmt(lo.get('profiling_s'), '.1f')} s; "
            f"plan {((lo.get('plan') or {}).get('assignment'))}"
        )
        phases = lo.get("phase_s") or {}
        if phases:
            print(
                "loomrl iteration breakdown (s): "
                + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="smollm2-135m-instruct | tiny-llama | random-smollm2-135m | random-0.5b | HF dir",
    )
    p.add_argument("--steps", type=int, default=3, help="measured steps per side")
    p.add_argument("--warmup", type=int, default=1, help="steps run first and not measured")
    p.add_argument("--batch", type=int, default=4, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="responses per prompt (GRPO's G)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument(
        "--train-micro-batch",
        type=int,
        default=8,
        help="sequences per forward/backward on both sides",
    )
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--level", type=int, default=2, help="arithmetic task level")
    p.add_argument(
        "--instruction",
        default="think",
        help="prompt instruction (loomrl task.instruction): think | direct",
    )
    p.add_argument(
        "--loomrl-plan",
        choices=("profile", "calibrate"),
        default="profile",
        help="profile: loomrl profiles the components, then plans (time reported apart); "
        "calibrate: no profiling, the warm-up iteration measures the costs",
    )
    p.add_argument(
        "--offload",
        choices=("auto", "never", "always"),
        default="auto",
        help="loomrl's run.offload for time-shared stages",
    )
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="auto: fp32 on CPU, bf16 autocast on CUDA; bf16 / fp32: that on both devices",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--only", choices=("both", "loomrl", "trl"), default="both")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per side")
    p.add_argument(
        "--out",
        default="grpo_vs_trl.json",
        help="write the results as JSON here (default: grpo_vs_trl.json; '' writes none)",
    )
    # Internal: one side, run in a child process.
    p.add_argument("--side", choices=("loomrl", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    problems = []
    for key in ("steps", "batch", "max_new_tokens", "train_micro_batch"):
        if getattr(a, key) < 1:
            problems.append(f"--{key.replace('_', '-')}={getattr(a, key)}: must be >= 1")
    if a.warmup < 0:
        problems.append(f"--warmup={a.warmup}: must be >= 0")
    if a.group_size < 2:
        problems.append(f"--group-size={a.group_size}: GRPO needs >= 2 responses per prompt")
    if a.beta < 0:
        problems.append(f"--beta={a.beta}: must be >= 0")
    if problems:
        p.error("; ".join(problems))
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.side:
        spec = json.loads(Path(a.spec).read_text())
        out = run_loomrl_side(spec) if a.side == "loomrl" else run_trl_side(spec)
        Path(a.result).write_text(json.dumps(out, default=str))
        return 0

    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl-") as work:
        spec = {
            "model": a.model,
            "steps": a.steps,
            "warmup": a.warmup,
            "batch": a.batch,
            "group_size": a.group_size,
            "max_new_tokens": a.max_new_tokens,
            "train_micro_batch": a.train_micro_batch,
            "lr": a.lr,
            "beta": a.beta,
            "temperature": a.temperature,
            "level": a.level,
            "instruction": a.instruction,
            "loomrl_plan": a.loomrl_plan,
            "offload": a.offload,
            "precision": a.precision,
            "seed": a.seed,
            "device": a.device,
            "workdir": work,
        }
        res: dict[str, Any] = {
            "config": {k: v for k, v in spec.items() if k != "workdir"},
            "uptime_start": uptime(),
            "load_samples": [],
        }
        sides = ("loomrl", "trl") if a.only == "both" else (a.only,)
        for side in sides:
            load_before = load_average()
            out, log, took = run_child(side, spec, a.timeout)
            res["load_samples"].append(
                {"side": side, "before": load_before, "after": load_average()}
            )
            if out is None:
                tail = "\n".join(log.splitlines()[-30:])
                res[side] = {"error": f"{side} run failed", "log_tail": tail}
                print(
                    f"{side}: FAILED (exit status or no result); last lines:\n{tail}",
                    file=sys.stderr,
                )
                continue
            out["process_s"] = took
            if side == "loomrl":
                out["profiling_s"] = profiling_seconds(log)
            res[side] = out
        res["uptime_end"] = uptime()

    lo, tr = res.get("loomrl") or {}, res.get("trl") or {}
    ratio = None
    if lo.get("tokens_per_s") and tr.get("tokens_per_s"):
        ratio = lo["tokens_per_s"] / tr["tokens_per_s"]
    res["ratio"] = ratio
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(
        f"model {a.model}, {a.batch} prompts x {a.group_size} responses, <= {a.max_new_tokens} new tokens, "
        f"{a.warmup} warm-up + {a.steps} measured steps, device {a.device}, precision {a.precision}"
    )
    print(f"uptime at start: {res['uptime_start']}")
    print(f"uptime at end:   {res['uptime_end']}")
    print_table(res)
    print(f"ratio: {ratio:.3f}" if ratio is not None else "ratio: nan")
    return 0 if ratio is not None or a.only != "both" else 1


if __name__ == "__main__":
    sys.exit(main())
