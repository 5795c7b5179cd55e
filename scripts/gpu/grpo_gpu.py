"""The GRPO recipe on one GPU through the `loomrl run` CLI; collects what the run wrote into one JSON.

Run (GPU machine):
  python scripts/gpu/grpo_gpu.py --mode calibrate --model-dir /tmp/random-smollm2-135m-f32 \
      --out $OUT/grpo_calibrate.json --timeout 200
  python scripts/gpu/grpo_gpu.py --mode auto ...      (placement=auto: profile, then plan)

With one GPU the cluster has devices=1, so every plan the planner can choose is temporal (all
components time-share device 0); `auto` still profiles the components and searches.
The JSON holds run_summary.json (predicted vs measured iteration time, plan), every metrics.jsonl
row (tokens/s per step), the timeline's per-component seconds, and the CLI's output tail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def ensure_model(model_dir: str) -> float:
    if (Path(model_dir) / "config.json").exists():
        return 0.0
    from loomrl.models import random_model_like

    t = time.perf_counter()
    random_model_like(
        model_dir, "smollm2-135m"
    )  # fp32 weights: the actor trains in fp32 + bf16 compute
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("calibrate", "auto", "temporal-profile"), required=True)
    ap.add_argument("--model-dir", default="/tmp/random-smollm2-135m-f32")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("extra", nargs="*", help="more key=value overrides")
    a = ap.parse_args()

    res: dict = {"mode": a.mode, "model_build_s": ensure_model(a.model_dir)}
    run_dir = a.run_dir or f"/tmp/runs/grpo_{a.mode}"
    overrides = [f"model.path={a.model_dir}", f"steps={a.steps}", f"output_dir={run_dir}"]
    if a.mode == "calibrate":
        overrides += ["placement=temporal", "run.profile=calibrate"]
    elif a.mode == "auto":
        overrides += ["placement=auto"]
    else:
        overrides += ["placement=temporal"]
    cmd = [
        sys.executable,
        "-m",
        "loomrl.cli",
        "run",
        str(HERE / "grpo_gpu.yaml"),
        *overrides,
        *a.extra,
    ]
    res["cmd"] = " ".join(cmd)
    print("[grpo]", res["cmd"], flush=True)
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        res["returncode"], out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        res["returncode"] = "timeout"
        out = (
            (e.stdout or b"").decode(errors="replace")
            if isinstance(e.stdout, bytes)
            else (e.stdout or "")
        )
        out += (
            (e.stderr or b"").decode(errors="replace")
            if isinstance(e.stderr, bytes)
            else (e.stderr or "")
        )
    res["process_s"] = time.perf_counter() - t
    res["output_tail"] = out[-6000:]
    print(out[-3000:], flush=True)

    rd = Path(run_dir)
    if (rd / "run_summary.json").exists():
        res["run_summary"] = json.loads((rd / "run_summary.json").read_text())
    if (rd / "metrics.jsonl").exists():
        rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if x.strip()]
        res["metrics"] = rows
        steps = [r for r in rows if "iteration_s" in r]
        tps = [r["tokens_per_s"] for r in steps if "tokens_per_s" in r]
        it = [r["iteration_s"] for r in steps]
        if steps:
            res["tokens_per_s_all"] = tps
            res["tokens_per_s_median_after_first"] = (
                statistics.median(tps[1:]) if len(tps) > 1 else None
            )
            res["iteration_s_median_after_first"] = (
                statistics.median(it[1:]) if len(it) > 1 else None
            )
    if (rd / "timeline.jsonl").exists():
        per = []
        for line in (rd / "timeline.jsonl").read_text().splitlines():
            acc: dict[str, float] = {}
            for r in json.loads(line).get("records", []):
                k = f"{r.get('component')}/{r.get('kind')}"
                acc[k] = acc.get(k, 0.0) + float(r["end"]) - float(r["start"])
            per.append(acc)
        res["timeline_component_s"] = per
    res["files"] = (
        sorted(str(p.relative_to(rd)) for p in rd.rglob("*") if p.is_file())[:80]
        if rd.exists()
        else []
    )
    for name in ("plan.json", "profile.json", "workload_profile.json"):
        if (rd / name).exists():
            try:
                res[name] = json.loads((rd / name).read_text())
            except ValueError:
                res[name] = (rd / name).read_text()[:4000]
    Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    s = res.get("run_summary") or {}
    print(
        f"[grpo] {a.mode}: rc={res['returncode']} predicted={s.get('predicted_iteration_s')} "
        f"measured={s.get('measured_iteration_s')} tokens/s(median after 1st)="
        f"{res.get('tokens_per_s_median_after_first')} plan={s.get('plan')}",
        flush=True,
    )
    return 0 if res["returncode"] == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
