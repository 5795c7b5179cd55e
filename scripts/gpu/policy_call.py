"""Where one call of the pixel policy spends its fixed cost on a GPU, alone and beside renderers.

    python scripts/gpu/policy_call.py --renderers 4 --row-blocks 1,8,32 --out policy_call.json

In one process (no Ray), the built-in CNN policy acts the way ``PolicyWorker._act`` does on
n = 1, 8, 32, 64 rows of 64x64 images, its forward in blocks of each ``--row-blocks`` size
(1: row by row), with one random stream per row. Timed per call
(median of reps), each path ending with the results on the host:

* ``act``: host -> GPU copy, forward row by row, sampling, three GPU -> host copies (action,
  log-prob, value), as the worker does;
* ``act_one_copy``: the same with the three results copied back in one tensor;
* ``act_noise_first``: also the per-row noise drawn and copied to the GPU before the forward
  (instead of after it, where that copy waits for the forward to finish);
* ``act_no_checks``: that, and torch.distributions' argument validation off (its checks copy
  a flag back from the GPU, another wait in the middle of the call);
* ``act_graph``: ``act`` with the forward replayed as a CUDA graph (``use_cuda_graphs``, the
  worker's default on a GPU); ``graph_equal`` says whether it gave the same bits as ``act`` on images other than those it
  was recorded on;
* ``act_host``: the worker's path on a GPU (``act_host``): forward, sampling and log-prob as
  one CUDA graph, plain host tensors in, one copy back; ``host_equal`` says whether it gave
  ``act``'s bits;
* ``act_host_pinned``: the same through page-locked host buffers, copies without waits and
  one wait at the end (``host_io="pinned"``; calls BQ-BR timed it as ``act_host`` and the
  default as ``act_host_pageable``);
* ``forward``: forward row by row and one synchronise;
* ``h2d``: the host -> GPU copy of the images and one synchronise;
* ``gens``: the rows' streams and their noise, on the host (``row_generators(...).normal``,
  what the built-ins draw per call; before b6630c8 it timed building one ``torch.Generator``
  per row, without the draws).

Then the same again while ``--renderers`` processes render MuJoCo frames with EGL on the same GPU
nonstop (as env workers do in a split cycle). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path


def render_forever(stop, size: int) -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    import gymnasium as gym

    env = gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=size, height=size)
    env.reset(seed=0)
    while not stop.is_set():
        env.step(env.action_space.sample())
        env.render()


def time_size(net, dev: str, n: int, reps: int, gnet=None) -> dict:
    """Median seconds of each path on n rows; ``gnet``: a copy of ``net`` using CUDA graphs."""
    import numpy as np
    import torch

    from loomrl.policies import row_generators

    raw = np.random.default_rng(0).integers(0, 255, (n, 3, 64, 64), dtype=np.uint8)
    ids, steps = list(range(n)), [3] * n

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    def act(policy=net) -> None:
        gens = row_generators(0, ids, steps)
        a, logp, v = policy.act(torch.as_tensor(raw).to(dev), generators=gens)
        a.cpu(), logp.float().cpu(), v.float().cpu()

    def act_graph() -> None:
        act(gnet)

    def act_host() -> None:
        gnet.act_host(torch.as_tensor(raw), generators=row_generators(0, ids, steps))

    def act_host_pinned() -> None:
        gnet.host_io = "pinned"
        try:
            act_host()
        finally:
            gnet.host_io = "pageable"

    def act_one_copy() -> None:
        gens = row_generators(0, ids, steps)
        a, logp, v = net.act(torch.as_tensor(raw).to(dev), generators=gens)
        torch.cat([a.float().reshape(n, -1), logp.float()[:, None], v.float()[:, None]], 1).cpu()

    def act_noise_first() -> None:
        # The per-row noise drawn on the host and copied before the forward is queued, so that
        # no host -> GPU copy waits for the forward in the middle of the call.
        gens = row_generators(0, ids, steps)
        eps = net.heads.noise(gens, dev)
        o = torch.as_tensor(raw).to(dev)
        with torch.no_grad():
            out, v = net._rows(o)
            a = out + net.heads.log_std.exp() * eps
            logp, _ = net.heads.log_prob(out, net.heads.to_env(a))
            a = net.heads.to_env(a)
        torch.cat([a.float().reshape(n, -1), logp.float()[:, None], v.float()[:, None]], 1).cpu()

    def act_no_checks() -> None:
        # Also without torch.distributions' argument checks, whose .all() waits for the GPU.
        torch.distributions.Distribution.set_default_validate_args(False)
        try:
            act_noise_first()
        finally:
            torch.distributions.Distribution.set_default_validate_args(True)

    def forward() -> None:
        with torch.no_grad():
            net._rows(torch.as_tensor(raw).to(dev))
        sync()

    def h2d() -> None:
        torch.as_tensor(raw).to(dev)
        sync()

    def gens() -> None:
        row_generators(0, ids, steps).normal(net.heads.action_dim)

    row = {}
    if gnet is not None:  # recorded on raw, compared on other images (replays)
        act_graph()
        other = np.random.default_rng(n).integers(0, 255, raw.shape, dtype=np.uint8)
        eager = net.act(torch.as_tensor(other).to(dev), generators=row_generators(0, ids, steps))
        graphed = gnet.act(torch.as_tensor(other).to(dev), generators=row_generators(0, ids, steps))
        row["graph_equal"] = all(
            torch.equal(x.cpu(), y.cpu()) for x, y in zip(eager, graphed, strict=True)
        )
        host = gnet.act_host(torch.as_tensor(other), generators=row_generators(0, ids, steps))
        row["host_equal"] = all(torch.equal(x.cpu(), y) for x, y in zip(eager, host, strict=True))
    paths = (
        ("act", act),
        *(
            (
                ("act_graph", act_graph),
                ("act_host", act_host),
                ("act_host_pinned", act_host_pinned),
            )
            if gnet is not None
            else ()
        ),
        ("act_one_copy", act_one_copy),
        ("act_noise_first", act_noise_first),
        ("act_no_checks", act_no_checks),
        ("forward", forward),
        ("h2d", h2d),
    )
    for name, f in (*paths, ("gens", gens)):
        f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        row[name] = statistics.median(ts)
    return row


def measure(reps: int, sizes: list[int], policy_kwargs: dict | None = None) -> dict:
    import copy

    import gymnasium as gym
    import numpy as np
    import torch

    from loomrl.policies import make_policy

    obs_space = gym.spaces.Box(0, 255, (3, 64, 64), np.uint8)
    act_space = gym.spaces.Box(-3.0, 3.0, (1,), np.float32)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of the script
    net = make_policy(obs_space, act_space, 0, **(policy_kwargs or {})).to(dev)
    gnet = None
    if dev == "cuda":
        gnet = copy.deepcopy(net)
        gnet.use_cuda_graphs()
    return {n: time_size(net, dev, n, reps, gnet) for n in sizes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--renderers", type=int, default=4)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--sizes", default="1,8,32,64", help="rows per call, comma-separated")
    p.add_argument(
        "--row-blocks", default="1,8", help="the forward's block sizes to time, comma-separated"
    )
    p.add_argument(
        "--policy-kwargs", type=json.loads, default={}, help="JSON object for make_policy"
    )
    p.add_argument("--out", default=None)
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    blocks = [int(x) for x in args.row_blocks.split(",")]

    def per_block() -> dict:
        return {
            f"row_block_{b}": measure(args.reps, sizes, {**args.policy_kwargs, "row_block": b})
            for b in blocks
        }

    res = {"alone": per_block()}
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=render_forever, args=(stop, 64)) for _ in range(args.renderers)]
    for q in procs:
        q.start()
    time.sleep(5.0)  # the renderers start their GL contexts
    res["beside_renderers"] = per_block()
    stop.set()
    for q in procs:
        q.join(timeout=10)
        if q.is_alive():
            q.kill()
    for case, by_block in res.items():
        for block, rows in by_block.items():
            for n, r in rows.items():
                print(
                    f"{case:<17} {block:<12} n={n:>3}: "
                    + "  ".join(
                        f"{k} {v}" if isinstance(v, bool) else f"{k} {1e3 * v:6.2f}"
                        for k, v in r.items()
                    )
                    + "  (ms)"
                )
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
