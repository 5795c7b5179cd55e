"""Actor -> rollout weight push on GPUs: every route of loomrl.weights beside the object store.

Run (GPU machine):  python scripts/gpu/weight_sync_bench.py --model-dir DIR [--model-dir DIR2] \
                        --out $OUT/weight_sync.json

The real reasoning workers are used: an ActorWorker (fp32 weights on its GPU, as it trains) and a
RolloutWorker (bf16 weights). Per model and route, 5 pushes after one warm-up push; each push is
preceded by a parameter change on the actor, and afterwards the rollout's weights are compared
with the actor's (cast to bf16) by a checksum. Routes:

  cuda_ipc       both on GPU 0 (auto's choice there)
  nccl           actor on GPU 0, rollout on GPU 1 (auto's choice there; needs two GPUs)
  shared_memory  forced, both on GPU 0: one host segment, GPU -> host -> GPU
  object_store   the baseline: buckets copied to host numpy, ray.put, ray.get, copied in
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loomrl import Cluster, wait  # noqa: E402
from loomrl.weights import WeightSync  # noqa: E402
from loomrl.workers.reasoning import (  # noqa: E402
    ActorWorker,
    AlgoConfig,
    ModelConfig,
    RolloutWorker,
    SamplingConfig,
)


class BenchActor(ActorWorker):
    def nudge(self) -> None:
        import torch

        with torch.no_grad():
            for _, p in self.engine.named_parameters():
                p.add_(1e-3)
        self.engine.version += 1

    def checksum(self) -> float:
        import torch

        return sum(
            float(p.detach().to(torch.bfloat16).double().sum())
            for _, p in self.engine.named_parameters()
        )

    def to_object_store(self, bucket_mb: float) -> list:
        import ray

        buckets = self.engine.get_weights_buckets(bucket_mb, device="cpu")
        return [ray.put({k: v.numpy() for k, v in b.items()}) for b in buckets]


class BenchRollout(RolloutWorker):
    def checksum(self) -> float:
        import torch

        return sum(
            float(p.detach().to(torch.bfloat16).double().sum())
            for _, p in self.engine.named_parameters()
        )

    def from_object_store(self, refs: list, version: int) -> int:
        import ray
        import torch

        for ref in refs:
            self.engine.set_weights({k: torch.from_numpy(v) for k, v in ray.get(ref).items()})
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.engine.version = version
        return version


def time_route(actor, rollout, route: str, bucket_mb: float, reps: int) -> dict:
    sync = (
        None
        if route == "object_store"
        else WeightSync(
            actor,
            rollout,
            bucket_mb=bucket_mb,
            path="auto" if route in ("cuda_ipc", "nccl") else route,
        )
    )
    secs, seen = [], set()
    for i in range(reps + 1):
        wait(actor.nudge())
        t = time.perf_counter()
        if sync is None:
            refs = wait(actor.to_object_store(bucket_mb))[0]
            v = wait(actor.weights_endpoint())[0]["version"]
            wait(rollout.from_object_store(refs, v))
        else:
            sync()
            seen.update(sync.last.routes)
        dt = time.perf_counter() - t
        if i:
            secs.append(dt)
    ok = wait(actor.checksum())[0] == wait(rollout.checksum())[0]
    return {
        "route": route,
        "routes_taken": sorted(seen) if sync else ["object_store"],
        "seconds": secs,
        "best_s": min(secs),
        "median_s": statistics.median(secs),
        "checksum_equal": ok,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", action="append", required=True)
    p.add_argument("--bucket-mb", type=float, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    cluster = Cluster.start()
    n = cluster.num_devices
    res: dict = {"gpus": n, "bucket_mb": a.bucket_mb, "models": {}}
    try:
        for d in a.model_dir:
            model = ModelConfig(path=d)
            actor = cluster.launch(
                BenchActor, 1, model, SamplingConfig(), AlgoConfig(), 0, devices=[0], name="a"
            )
            rows = []
            places = [(0, ("cuda_ipc", "shared_memory", "object_store"))]
            if n >= 2:
                places.append((1, ("nccl",)))
            for dev, routes in places:
                rollout = cluster.launch(
                    BenchRollout, 1, model, SamplingConfig(), 0, devices=[dev], name=f"r{dev}"
                )
                for r in routes:
                    row = time_route(actor, rollout, r, a.bucket_mb, a.reps)
                    row["rollout_gpu"] = dev
                    rows.append(row)
                    print(d, json.dumps(row), flush=True)
                rollout.kill()
            actor.kill()
            res["models"][d] = rows
    finally:
        cluster.shutdown()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
