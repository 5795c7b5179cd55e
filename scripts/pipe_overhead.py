"""Time a pipe rollout's start and close, called apart against in one call a side.

    python scripts/pipe_overhead.py --workers 4

On an embedded Ray cluster of this machine: ``--workers`` env workers of HalfCheetah-v5 (64 envs
in all) and one policy worker, a k = 2 pipe cycle of 32 steps. In turns, 12 times each after two
warm-up rounds: a rollout as three driver calls (``begin``, ``pipe_rollout``, then ``finish``
with the env workers' ``pop_stats``), and ``EnvPolicyCycle.collect``, which begins, finishes and
collects the statistics inside the rollout's own calls. Prints, for each, the median of the
rollout's time outside its steps (its wall time less the pipe's span) in ms.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=4, help="env workers (1, 2 or 4)")
    p.add_argument("--rounds", type=int, default=12)
    a = p.parse_args()
    from loomrl import Cluster, wait
    from loomrl.cycle import EnvPolicyCycle, pipe_rollout
    from loomrl.embodied import PPOConfig
    from loomrl.envs import EnvConfig
    from loomrl.envs.vec import VecEnv
    from loomrl.workers.env import EnvWorker, worker_env_config
    from loomrl.workers.policy import PolicyWorker

    env = EnvConfig("HalfCheetah-v5", num_envs=64, seed=1, cpu_cores=0.25)
    v = VecEnv(env)
    spaces = (v.single_observation_space, v.single_action_space)
    v.close()
    c = Cluster.start(num_cpus=2, num_gpus=4)
    try:
        w = a.workers
        cfg = worker_env_config(env, w)
        envs = c.launch(EnvWorker, w, cfg, devices=list(range(w)), num_cpus=0.25, name="env")
        ppo = PPOConfig(rollout_steps=64 * 32, seed=1)
        pol = c.launch(PolicyWorker, 1, *spaces, 64, ppo, 1, devices=[3], name="policy")
        cycle = EnvPolicyCycle(envs, pol, 64 // w, 2, True, handoff="pipe")
        apart, whole = [], []
        for r in range(a.rounds + 2):
            if r == 0:  # opens the policy's socket; a warm-up
                cycle.collect(32)
            t0 = time.perf_counter()
            wait(pol.begin(32))
            timing = pipe_rollout(pol, cycle._env, cycle._socket, cycle._tuples(), 32, 60.0)
            wait(pol.finish(), envs.pop_stats())
            t1 = time.perf_counter()
            res = cycle.collect(32)
            t2 = time.perf_counter()
            if r >= 2:
                apart.append((t1 - t0 - timing["span_s"]) * 1e3)
                whole.append((t2 - t1 - res.span_s) * 1e3)
        for name, xs in (("three calls", apart), ("one call a side", whole)):
            print(f"{name}: {statistics.median(xs):.2f} ms [{min(xs):.2f}-{max(xs):.2f}]")
    finally:
        c.shutdown()


if __name__ == "__main__":
    main()
