"""Making a flow's hop channels: one Channel.create after another, or Channel.create_many.

Run:  python benchmarks/channel_create.py --out runs/bench_channel_create.json   (about 30 s)

Each channel's broker is a Ray actor, a process of its own that takes most of a second to
start on two cores; a flow makes one channel per hop (three for a three-stage chain) on its
first run. ``create_many`` starts every broker before it waits for any. The table gives the
median seconds to make ``--channels`` channels each way, over ``--reps`` alternating trials.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default="runs/bench_channel_create.json")
    args = ap.parse_args()

    from loomrl import Cluster
    from loomrl.channel import Channel

    cluster = Cluster.start(num_cpus=2)

    def one_by_one(names: list[str], sizes: list[int]) -> list[Channel]:
        return [Channel.create(n, maxsize=s) for n, s in zip(names, sizes, strict=True)]

    ways = {"create one by one": one_by_one, "create_many": Channel.create_many}
    took: dict[str, list[float]] = {k: [] for k in ways}
    try:
        for _ in range(args.reps):
            for way, make in ways.items():  # alternating: a slow spell of the host hits both
                names = [f"bench-{uuid.uuid4().hex[:8]}-{i}" for i in range(args.channels)]
                t = time.perf_counter()
                made = make(names, [0] * args.channels)
                took[way].append(time.perf_counter() - t)
                for ch in made:
                    ch.delete()
    finally:
        cluster.shutdown()
    rows = {k: statistics.median(v) for k, v in took.items()}
    print(f"{'way':<20} {'median s':>9}   ({args.channels} channels, {args.reps} trials)")
    for way, s in rows.items():
        print(f"{way:<20} {s:>9.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"channels": args.channels, "median_s": rows, "trials": took}))


if __name__ == "__main__":
    main()
