"""Where one PPO update of the pixel policy spends its time on a GPU (the part of an embodied
iteration that no placement overlaps, so it sets how close hybrid/temporal can come to the
cycle's own ratio).

    python scripts/gpu/update_profile.py --num-envs 16 --steps 32 --out update_profile.json

Builds the built-in CNN policy for 3x64x64 uint8 images and a rollout buffer of random data of
the benchmark's shape, then times (CUDA-synchronised, medians over --reps): the buffer's copy to
the device, GAE, and ``ppo_update`` with torch's default Adam, with the fused Adam the policy
worker uses without graphs, with the capturable one run eagerly, and with that recorded as a
CUDA graph (``GraphedPPOStep``, as the worker runs it on a GPU); and profiles one eager update
(the top operators by self CPU time, and the kernels' time on the device).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    import gymnasium as gym
    import numpy as np
    import torch
    from torch.autograd import DeviceType

    from loomrl.embodied import (
        GraphedPPOStep,
        PPOConfig,
        RolloutBuffer,
        capturable_adam,
        compute_advantages,
        ppo_update,
    )
    from loomrl.policies import make_policy
    from loomrl.workers.policy import _to_device

    ap = argparse.ArgumentParser()
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cuda", help="cpu to try the script without a GPU")
    ap.add_argument("--out", default="update_profile.json")
    args = ap.parse_args()

    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    T, N, s = args.steps, args.num_envs, args.image_size
    obs_space = gym.spaces.Box(0, 255, (3, s, s), np.uint8)
    act_space = gym.spaces.Box(-3.0, 3.0, (1,), np.float32)
    ppo = PPOConfig(epochs=args.epochs, num_minibatches=args.minibatches)
    g = torch.Generator().manual_seed(0)
    buf = RolloutBuffer(
        obs=torch.randint(0, 256, (T, N, 3, s, s), dtype=torch.uint8, generator=g),
        actions=torch.randn(T, N, 1, generator=g),
        logp=torch.randn(T, N, generator=g) - 1.0,
        values=torch.randn(T, N, generator=g),
        rewards=torch.ones(T, N),
        terminated=torch.zeros(T, N, dtype=torch.bool),
        truncated=torch.zeros(T, N, dtype=torch.bool),
        final_values=torch.zeros(T, N),
        last_value=torch.randn(N, generator=g),
    )

    def timed(fn, reps: int = args.reps) -> list[float]:
        fn()  # warm-up (cuDNN's choice of algorithms, allocator)
        out = []
        for _ in range(reps):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - t)
        return out

    res: dict = {"args": vars(args), "torch": torch.__version__}
    res["to_device_s"] = timed(lambda: _to_device(buf, dev))
    dbuf = _to_device(buf, dev)
    res["gae_s"] = timed(lambda: compute_advantages(dbuf, ppo.gamma, ppo.gae_lambda))

    def adam(params, **kw):
        return torch.optim.Adam(params, lr=ppo.lr, eps=ppo.adam_eps, **kw)

    def capturable(params):
        return capturable_adam(params, ppo.lr, ppo.adam_eps, dev)

    # torch's default Adam (foreach on a GPU); the worker's without graphs (fused); the
    # recordable one run eagerly; and the worker's with graphs (recorded).
    variants = [("adam", adam, False)]
    if dev.startswith("cuda"):
        variants += [
            ("adam_fused", lambda p: adam(p, fused=True), False),
            ("adam_capturable", capturable, False),
            ("graphed", capturable, True),
        ]
    for name, make_opt, graphed in variants:
        net = make_policy(obs_space, act_space, seed=0).to(dev)
        opt = make_opt(net.parameters())
        step = GraphedPPOStep(net, opt, ppo) if graphed else None
        shuffle = torch.Generator().manual_seed(0)
        res[f"update_{name}_s"] = timed(
            lambda net=net, opt=opt, sh=shuffle, st=step: ppo_update(
                net, opt, dbuf, ppo, generator=sh, step=st
            )
        )
        if step is not None:
            res["graphed_captures"], res["graphed_failed"] = step.captures, step.failed
    net = make_policy(obs_space, act_space, seed=0).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=ppo.lr, eps=ppo.adam_eps)
    ppo_update(net, opt, dbuf, ppo)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU]
        + ([torch.profiler.ProfilerActivity.CUDA] if dev.startswith("cuda") else [])
    ) as prof:
        ppo_update(net, opt, dbuf, ppo)
        sync()
    ka = prof.key_averages()
    rows = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
    res["profile_top"] = [
        {
            "op": e.key,
            "calls": e.count,
            "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3,
        }
        for e in rows
    ]
    # Kernels only: an operator's row also carries the device time of the kernels it launched,
    # so a sum over every row counts that time twice.
    res["device_busy_ms"] = (
        sum(e.self_device_time_total for e in ka if e.device_type == DeviceType.CUDA) / 1e3
    )
    for k, v in list(res.items()):
        if k.endswith("_s") and isinstance(v, list):
            print(f"{k}: median {statistics.median(v) * 1e3:.2f} ms ({len(v)} reps)")
    print(f"device busy in one update: {res['device_busy_ms']:.1f} ms")
    for r in res["profile_top"][:15]:
        print(
            f"  {r['op'][:40]:40s} calls {r['calls']:5d} self cpu {r['self_cpu_ms']:7.2f} ms"
            f" device {r['device_ms']:7.2f} ms"
        )
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
