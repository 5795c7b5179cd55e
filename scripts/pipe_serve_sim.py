"""Simulate a pipe rollout to compare how the policy serves a split cycle (cycle_batch).

    python scripts/pipe_serve_sim.py                       # the H200 costs of calls EO-ER
    python scripts/pipe_serve_sim.py --workers 16 --env-ms 3.85 --json out.json

A discrete-event model of ``EnvPolicyCycle(handoff="pipe")``: ``--workers`` env workers, each
with k parts (one per ring group) of ``num_envs / (workers * k)`` rows, step their parts in
ring order, each step of a part taking ``--env-ms`` per env worker step of all its envs, split
over its parts, times a log-normal noise (``--noise``), and each hand-off ``--latency-ms`` one
way. The policy makes one call at a time, ``--call-ms`` plus ``--row-us`` per row, and acts by
the rule simulated:

* ``lockstep``: ring group after ring group, each waiting for all of its parts (k = 1 is the
  temporal plan: every env worker steps, then the policy acts on all rows);
* ``ready``: on every part that has replied (``cycle_batch: ready``);
* ``group``: once the replies hold a ring group's rows, or no env worker has anything left to
  send (``cycle_batch: group``).

It prints the simulated rollout span per rule and k, the policy's calls and busy seconds, and the
env workers' mean wait for actions, and the ratio of the temporal span (k = 1) to each split
span. The defaults are the costs measured on one H200 at 512 HalfCheetah-v5 envs on 8 env
workers (scripts/gpu/RESULTS.md, calls EO-ER): an env worker's step of its 64 envs 6 ms, a
policy call 0.75 ms plus 4.5 us a row. A model, not a measurement: it leaves out the rollout's
start and close, the update, and any contention between processes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Costs:
    num_envs: int = 512
    workers: int = 8
    steps: int = 32
    env_ms: float = 6.0  # one env worker's step of all its envs
    call_ms: float = 0.75
    row_us: float = 4.5
    latency_ms: float = 0.05
    noise: float = 0.1  # sigma of the log-normal factor on each part's step


def simulate(c: Costs, k: int, rule: str, seed: int = 0) -> dict[str, float]:
    """One rollout of ``c`` with k ring groups served by ``rule``. Pure (seeded)."""
    rng = random.Random(seed)
    rows = c.num_envs // (c.workers * k)  # per part
    part_ms = c.env_ms / k
    lat = c.latency_ms
    # Events: (time, order, kind, worker, part, step)
    events: list[tuple[float, int, str, int, int, int]] = []
    order = 0

    def push(t: float, kind: str, w: int, j: int, s: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, w, j, s))

    for w in range(c.workers):
        for j in range(k):
            push(lat, "reply", w, j, 0)  # the first observations
    busy_until = 0.0
    held: list[tuple[int, int, int]] = []  # (worker, part, step) replied, not acted on
    sent = [0] * c.workers
    got = [0] * c.workers
    # A worker steps its parts in ring order: the actions of (part, step) it waits for next.
    nxt = [(0, 0)] * c.workers
    inbox: list[dict[tuple[int, int], float]] = [{} for _ in range(c.workers)]
    free_at = [0.0] * c.workers  # when each worker finishes its current step
    wait = [0.0] * c.workers
    calls, busy, end = 0, 0.0, 0.0

    def worker_go(w: int) -> None:
        """Step every part whose actions have arrived, in ring order."""
        while True:
            j, s = nxt[w]
            if s >= c.steps or (j, s) not in inbox[w]:
                return
            arrive = inbox[w].pop((j, s))
            start = max(free_at[w], arrive)
            wait[w] += max(0.0, arrive - free_at[w])
            took = part_ms * math.exp(rng.gauss(0.0, c.noise))
            free_at[w] = start + took
            push(free_at[w] + lat, "reply", w, j, s + 1)
            nxt[w] = (j + 1, s) if j + 1 < k else (0, s + 1)

    def act(now: float, batch: list[tuple[int, int, int]]) -> None:
        nonlocal busy_until, calls, busy
        n = rows * len(batch)
        took = c.call_ms + c.row_us * n / 1000.0  # ms
        busy_until = now + took
        calls += 1
        busy += took
        for w, j, s in batch:
            sent[w] += 1
            push(busy_until + lat, "actions", w, j, s)
        push(busy_until, "idle", -1, -1, -1)

    def working() -> bool:
        return any(sent[w] + k > got[w] for w in range(c.workers))

    def decide(now: float) -> None:
        nonlocal held
        if busy_until > now or not held:
            return
        if rule == "ready":
            batch, held = held, []
        elif rule == "group":
            if rows * len(held) < c.num_envs // k and working():
                return
            batch, held = held, []
        else:  # lockstep: ring group after ring group, step after step, each whole
            j, s = turn
            batch = [x for x in held if x[1] == j and x[2] == s]
            if len(batch) < c.workers:
                return
            held = [x for x in held if x not in batch]
            turn[:] = [j + 1, s] if j + 1 < k else [0, s + 1]
        act(now, batch)

    turn = [0, 0]  # lockstep: the (ring group, step) served next
    while events:
        now, _, kind, w, j, s = heapq.heappop(events)
        if kind == "reply":
            got[w] += 1
            if s < c.steps:
                held.append((w, j, s))
            end = now
        elif kind == "actions":
            inbox[w][(j, s)] = now
            worker_go(w)
        decide(now)
    return {
        "span_ms": end,
        "calls": calls,
        "policy_busy_ms": busy,
        "env_wait_ms": statistics.fmean(wait),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = Costs()
    p.add_argument("--num-envs", type=int, default=d.num_envs)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--env-ms", type=float, default=d.env_ms)
    p.add_argument("--call-ms", type=float, default=d.call_ms)
    p.add_argument("--row-us", type=float, default=d.row_us)
    p.add_argument("--latency-ms", type=float, default=d.latency_ms)
    p.add_argument("--noise", type=float, default=d.noise)
    p.add_argument("--ks", default="2,4")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    c = Costs(a.num_envs, a.workers, a.steps, a.env_ms, a.call_ms, a.row_us, a.latency_ms, a.noise)
    out = []

    def run(k: int, rule: str) -> dict[str, float]:
        runs = [simulate(c, k, rule, seed) for seed in range(a.seeds)]
        return {key: statistics.median(r[key] for r in runs) for key in runs[0]}

    temporal = run(1, "lockstep")
    out.append({"k": 1, "rule": "lockstep", **temporal})
    print(f"{c}")
    print(f"temporal (k=1): span {temporal['span_ms']:.1f} ms, {temporal['calls']:.0f} calls")
    for k in (int(x) for x in a.ks.split(",")):
        for rule in ("lockstep", "ready", "group"):
            r = run(k, rule)
            out.append({"k": k, "rule": rule, **r})
            print(
                f"k={k} {rule:>8}: span {r['span_ms']:6.1f} ms, temporal/this "
                f"{temporal['span_ms'] / r['span_ms']:.3f}, {r['calls']:4.0f} calls, policy busy "
                f"{r['policy_busy_ms']:6.1f} ms, env wait {r['env_wait_ms']:6.1f} ms"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"costs": c.__dict__, "runs": out}, f, indent=1)


if __name__ == "__main__":
    main()
