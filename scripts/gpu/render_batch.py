"""Pixels drawn env by env against one pass per worker, on the machine's renderer.

    python scripts/gpu/render_batch.py --out render_batch.json

First checks that both paths give the same frames here (5 envs, random actions, episode ends
included). Then times ``VecEnv.step`` (physics, drawing, read-back, resize) of n envs per
process, with ``--procs`` processes stepping at once (as env workers do), for each path:
median ms per step per process and env-steps/s over all processes. Prints one table, writes
JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path


def same_frames(size: int) -> dict:
    import numpy as np

    from loomrl.envs import EnvConfig, VecEnv

    cfg = {"num_envs": 5, "pixels": True, "image_size": size}
    a = VecEnv(EnvConfig(**cfg))
    b = VecEnv(EnvConfig(**cfg, batch_render=False))
    equal = bool(np.array_equal(a.reset(), b.reset()))
    rng, ended, worst = np.random.default_rng(0), 0, 0
    for _ in range(40):
        act = rng.uniform(-3, 3, (5, 1)).astype(np.float32)
        ra, rb = a.step(act), b.step(act)
        for x, y in ((ra.obs, rb.obs), (ra.final_obs, rb.final_obs)):
            equal &= bool(np.array_equal(x, y))
            worst = max(worst, int(np.abs(x.astype(int) - y).max()))
        ended += int(ra.done.sum())
    out = {"equal": equal, "max_abs_diff": worst, "episodes_ended": ended, "path": a.render_path}
    a.close(), b.close()
    return out


def worker(n: int, size: int, batch: bool, steps: int, start, q) -> None:
    import numpy as np

    from loomrl.envs import EnvConfig, VecEnv

    v = VecEnv(EnvConfig(num_envs=n, pixels=True, image_size=size, batch_render=batch))
    v.reset()
    act = np.zeros((n, 1), np.float32)
    for _ in range(5):
        v.step(act)
    start.wait()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        v.step(act)
        times.append(time.perf_counter() - t)
    q.put((v.render_path, statistics.median(times), sum(times)))
    v.close()


def run(n: int, procs: int, size: int, batch: bool, steps: int) -> dict:
    ctx = mp.get_context("spawn")
    start, q = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(n, size, batch, steps, start, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    got = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    med = statistics.median(g[1] for g in got)
    wall = max(g[2] for g in got)
    return {
        "envs_per_proc": n,
        "procs": procs,
        "batch": batch,
        "path": got[0][0],
        "ms_per_step": round(med * 1e3, 3),
        "env_steps_per_s": round(n * procs * steps / wall, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="4,16", help="envs per process")
    p.add_argument("--procs", default="1,4")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    result = {"same_frames": same_frames(a.image_size), "rows": []}
    print("same frames:", result["same_frames"], flush=True)
    for procs in (int(x) for x in a.procs.split(",")):
        for n in (int(x) for x in a.sizes.split(",")):
            pair = [run(n, procs, a.image_size, batch, a.steps) for batch in (False, True)]
            result["rows"] += pair
            off, on = pair
            print(
                f"procs {procs} envs {n}: env by env {off['ms_per_step']:.2f} ms/step "
                f"({off['env_steps_per_s']:.0f} env-steps/s), batched {on['ms_per_step']:.2f} "
                f"ms/step ({on['env_steps_per_s']:.0f}); speed-up "
                f"{off['ms_per_step'] / on['ms_per_step']:.2f}x",
                flush=True,
            )
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
