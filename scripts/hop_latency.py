"""How long one env <-> policy hand-off takes through Ray, two ways, on this machine.

    python scripts/hop_latency.py --steps 300 --rows 8 --out hop_latency.json

The cycle (loomrl.cycle.EnvPolicyCycle) submits every call from the driver and passes each
result on as an ObjectRef: Ray returns the policy's actions to the driver (the ref's owner),
which then sends them to the env worker. The other way is for the env worker to call the policy
itself and wait for the reply: one message per hand-off fewer, the driver out of the path. Both
run the same two actors doing no work (a copy of the observation or action), so the time per
step is the hand-off alone: two hops per step. Observations are ``rows`` 64x64x3 uint8 images
(``--state``: 17 floats per row). Each way first runs once untimed; rounds then alternate which
way goes first. Eight image rows are 98,304 bytes, under Ray's limit for objects returned
inline to the caller (100 KiB by default): larger observations travel through the object store
instead, and the driver then only forwards their references.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--state", action="store_true", help="17 floats per row instead of an image")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import numpy as np
    import ray

    shape = (args.rows, 17) if args.state else (args.rows, 64, 64, 3)
    dtype = np.float32 if args.state else np.uint8

    @ray.remote(num_cpus=0)
    class Policy:
        def act(self, obs):
            return np.zeros((obs.shape[0], 1), np.float32) + float(obs.reshape(-1)[0])

    @ray.remote(num_cpus=0)
    class Env:
        def __init__(self):
            self.obs = np.zeros(shape, dtype)

        def reset(self):
            return self.obs.copy()

        def step(self, actions):
            self.obs.reshape(-1)[0] = int(actions[0, 0] + 1) % 100
            return self.obs.copy()

        def run(self, policy, steps):  # the env worker calls the policy itself
            obs = self.reset()
            for _ in range(steps):
                obs = self.step(ray.get(policy.act.remote(obs)))
            return int(obs.reshape(-1)[0])

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    env, pol = Env.remote(), Policy.remote()
    ray.get([env.reset.remote(), pol.act.remote(np.zeros(shape, dtype))])

    def driver_chained() -> float:
        t = time.perf_counter()
        obs = env.reset.remote()
        for _ in range(args.steps):
            obs = env.step.remote(pol.act.remote(obs))
        ray.get(obs)
        return (time.perf_counter() - t) / args.steps

    def direct() -> float:
        t = time.perf_counter()
        ray.get(env.run.remote(pol, args.steps))
        return (time.perf_counter() - t) / args.steps

    ways = {"driver_chained": driver_chained, "direct": direct}
    for fn in ways.values():  # untimed: the first calls of each path set up connections
        fn()
    per: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(args.rounds):
        for name in list(ways)[:: 1 if r % 2 == 0 else -1]:
            per[name].append(ways[name]())
    ray.shutdown()
    med = {k: statistics.median(v) for k, v in per.items()}
    for k, v in per.items():
        print(
            f"{k:<15} ms per step (2 hops): median {1e3 * med[k]:.3f}, "
            f"{1e3 * min(v):.3f}-{1e3 * max(v):.3f} over {len(v)} rounds"
        )
    print(f"driver_chained / direct: {med['driver_chained'] / med['direct']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "per_step_s": per, "median_s": med}, f, indent=2)


if __name__ == "__main__":
    main()
