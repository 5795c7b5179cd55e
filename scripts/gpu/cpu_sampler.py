"""Where the host's CPU time goes while a benchmark runs: every thread of every process sampled
from /proc every ``--interval`` seconds, its CPU time since the last sample charged to the core
it was last seen on. Stdlib only; runs beside a benchmark until ``--seconds`` pass or SIGTERM.

Answers: which processes (env workers, the policy, the driver, Ray's daemons) ran on which cores,
whether two busy threads shared a physical core (hyperthread siblings), and how busy each core
was second by second.

    python3 scripts/gpu/cpu_sampler.py --seconds 200 --out $OUT/cpu.json &
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections import defaultdict

TICK = os.sysconf("SC_CLK_TCK")


def siblings() -> dict[int, list[int]]:
    """Each core's hyperthread siblings (itself included), from sysfs."""
    out: dict[int, list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        try:
            text = open(path).read().strip()
        except OSError:
            out[cpu] = [cpu]
            continue
        cpus: list[int] = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        out[cpu] = cpus
    return out


def label(pid: int) -> str:
    try:
        raw = (
            open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return "?"
    raw = raw.strip() or "?"
    if raw.startswith("ray::"):
        return f"{raw.split()[0][:40]}#{pid}"
    if "default_worker.py" in raw or "/workers/" in raw:  # a Ray worker: one label per process
        return f"ray worker#{pid}"
    return raw[:60]


def threads() -> dict[tuple[int, int], tuple[int, int]]:
    """(pid, tid) -> (cpu ticks so far, core last run on)."""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                stat = open(f"/proc/{p}/task/{t}/stat").read()
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2 :].split()  # fields from 3 (state) on
            ticks = int(rest[11]) + int(rest[12])  # utime, stime (fields 14, 15)
            out[(int(p), int(t))] = (ticks, int(rest[36]))  # processor (field 39)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=200.0)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    me = os.getpid()
    t0 = time.time()
    prev = threads()
    names: dict[int, str] = {}
    # second -> process label -> core -> cpu seconds
    per_s: dict[int, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    affinity: dict[str, list[int]] = {}
    while not stop["now"] and time.time() - t0 < args.seconds:
        time.sleep(args.interval)
        now = threads()
        sec = int(time.time() - t0)
        for key, (ticks, cpu) in now.items():
            pid = key[0]
            if pid == me:
                continue
            d = ticks - prev.get(key, (ticks, cpu))[0]
            if d <= 0:
                continue
            if pid not in names:
                names[pid] = label(pid)
            try:  # the last seen: workers are pinned after they start
                affinity[names[pid]] = sorted(os.sched_getaffinity(pid))
            except OSError:
                pass
            cell = per_s[sec][names[pid]]
            cell[cpu] = cell.get(cpu, 0.0) + d / TICK
        prev = now
    sib = siblings()
    total: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for row in per_s.values():
        for name, cores in row.items():
            for c, v in cores.items():
                total[name][c] += v
    busy = sorted(total, key=lambda n: -sum(total[n].values()))
    doc = {
        "started": t0,
        "seconds": time.time() - t0,
        "cores": sorted(os.sched_getaffinity(0)),
        "siblings": {str(k): v for k, v in sib.items()},
        "affinity": affinity,
        "total": {n: {str(c): round(v, 3) for c, v in sorted(total[n].items())} for n in busy},
        "per_second": {
            str(s): {n: {str(c): round(v, 3) for c, v in cs.items()} for n, cs in row.items()}
            for s, row in sorted(per_s.items())
        },
    }
    with open(args.out, "w") as f:
        json.dump(doc, f)
    print(f"cpu_sampler: {len(per_s)} s sampled; busiest processes (cpu s, cores):")
    for n in busy[:16]:
        cs = total[n]
        top = sorted(cs, key=lambda c: -cs[c])[:6]
        mask = affinity.get(n, [])
        held = "all" if len(mask) == len(sib) else ",".join(map(str, mask))
        print(
            f"  {sum(cs.values()):7.1f}  {n[:44]:44s} [{held}] "
            + " ".join(f"{c}:{cs[c]:.1f}" for c in top)
        )
    pairs = sorted({tuple(v) for v in sib.values() if len(v) > 1})
    print(f"cpu_sampler: sibling pairs {pairs[:16]}")


if __name__ == "__main__":
    main()
