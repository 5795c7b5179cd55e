"""Demo workflow of real work: three matrix-product stages, one with long-tailed per-item cost.

Run: loomrl run examples/demo_matmul.yaml placement=auto

``encode`` does a fixed amount of matrix products per item, ``transform`` a log-normally distributed
amount (a long tail, like response lengths in RL rollouts), and ``reduce`` (the sink) a small fixed
amount. Every item's result depends only on its own seed, so outputs are identical under every plan.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

from loomrl.run import RunConfig
from loomrl.worker import Worker


@dataclass
class DemoConfig:
    size: int = 384  # matrix side
    encode_reps: int = 24  # matrix products per item in encode
    transform_reps: int = 40  # median products per item in transform
    transform_sigma: float = 0.6  # log-normal sigma of transform's per-item work (0 = constant)
    reduce_reps: int = 8
    resident_mb: int = 64  # buffer held while onloaded (freed by offload)
    transform_devices: list[int] | None = None  # device counts transform may use (None: any)
    # Drift (tests of run-time adaptation): from this step on, transform does drift_factor times
    # its work; the extra products are thrown away, so outputs do not change.
    drift_step: int | None = None
    drift_factor: float = 1.0

    def validate(self) -> list[str]:
        p = [
            f"{k}: must be >= {lo}, got {getattr(self, k)}"
            for k, lo in (
                ("size", 1),
                ("encode_reps", 0),
                ("transform_reps", 0),
                ("reduce_reps", 0),
                ("resident_mb", 0),
            )
            if getattr(self, k) < lo
        ]
        if not self.transform_sigma >= 0:
            p.append(
                f"transform_sigma: must be >= 0 (0: constant work), got {self.transform_sigma}"
            )
        if not self.drift_factor > 0:
            p.append(f"drift_factor: must be > 0, got {self.drift_factor}")
        t = self.transform_devices
        if t is not None and (not t or min(t) < 1):
            p.append(f"transform_devices: device counts must be >= 1 (null: any count), got {t}")
        return p


class _MatmulWorker(Worker):
    reps_attr = "encode_reps"
    stateless = True  # every result depends only on its item's seed

    def __init__(self, cfg: DemoConfig):
        super().__init__()
        self.cfg = cfg
        self.buffer = None

    def onload(self) -> None:
        import numpy as np

        self.buffer = np.ones(self.cfg.resident_mb * 2**20 // 8)

    def offload(self) -> None:
        self.buffer = None

    def _work(self, seed: int, reps: int):
        import torch

        g = torch.Generator().manual_seed(seed)
        a = torch.randn(self.cfg.size, self.cfg.size, generator=g) / math.sqrt(self.cfg.size)
        x = torch.randn(self.cfg.size, self.cfg.size, generator=g)
        for _ in range(reps):
            x = torch.tanh(a @ x)
        return x


class Encode(_MatmulWorker):
    def encode(self, items: list[dict]) -> list[dict]:
        out = []
        for it in items:
            x = self._work(it["seed"], self.cfg.encode_reps)
            out.append({**it, "encoded": float(x.sum())})
        return out


class Transform(_MatmulWorker):
    def reps(self, seed: int) -> int:
        if self.cfg.transform_sigma <= 0:
            return self.cfg.transform_reps
        r = random.Random(seed * 7919 + 1).lognormvariate(0.0, self.cfg.transform_sigma)
        return max(1, round(self.cfg.transform_reps * r))

    def transform(self, items: list[dict]) -> list[dict]:
        out = []
        for it in items:
            reps = self.reps(it["seed"])
            x = self._work(it["seed"] + 1, reps)
            drift = self.cfg.drift_step is not None and it.get("step", 0) >= self.cfg.drift_step
            if drift and self.cfg.drift_factor > 1:
                self._work(it["seed"] + 3, round(reps * (self.cfg.drift_factor - 1)))
            out.append({**it, "transformed": float(x.abs().mean()) + it["encoded"]})
        return out


class Reduce(_MatmulWorker):
    def reduce(self, items: list[dict]) -> list[str]:
        out = []
        for it in items:
            x = self._work(it["seed"] + 2, self.cfg.reduce_reps)
            h = hashlib.sha256(x.numpy().tobytes() + repr(it["transformed"]).encode()).hexdigest()
            out.append(h[:16])
        return out


def build(flow, cfg: DemoConfig):
    """Declare the three components and their chain on ``flow``."""
    enc = flow.group(Encode, cfg, name="encode")
    tra = flow.group(Transform, cfg, name="transform", valid_devices=cfg.transform_devices)
    red = flow.group(Reduce, cfg, name="reduce")
    flow.chain(enc.encode, tra.transform, red.reduce)
    return enc, tra, red


def make_items(step: int, batch: int, seed: int = 0) -> list[dict]:
    return [{"seed": seed * 1_000_003 + step * 10_007 + i, "step": step} for i in range(batch)]


@dataclass
class Config:
    """`recipe: demo` — the matrix-product workflow under any plan."""

    recipe: str = "demo"
    batch: int = 16
    demo: DemoConfig = field(default_factory=DemoConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> list[str]:
        p = self.run.flow_problems()
        return p + ([f"batch: must be >= 1 item, got {self.batch}"] if self.batch < 1 else [])


def main(cfg: Config) -> dict:
    """Driver loop: plan once, then run the chain each step and record the checksums."""
    from loomrl.flow import Flow
    from loomrl.run import Run

    run = Run(cfg, cfg.run)
    try:
        flow = Flow(run.cluster, run.dir, offload=cfg.run.offload)
        build(flow, cfg.demo)
        run.apply_plan(flow, make_items(0, cfg.batch, cfg.run.seed))
        digest = hashlib.sha256()
        for step in range(cfg.run.steps):
            result = flow.run(make_items(step, cfg.batch, cfg.run.seed))
            digest.update("".join(result.outputs).encode())
            run.record(step, result, flow)
            run.logger.log(  # row N: after iteration N-1, as in every recipe
                step + 1, {"iteration_s": result.measured_s, "predicted_s": result.predicted_s}
            )
        flow.shutdown()
        return run.summary(
            cfg.run.steps, digest.hexdigest(), {"outputs_sha256": digest.hexdigest()}
        )
    finally:
        run.close()


def profile(cfg: Config) -> str:
    """`loomrl profile examples/demo_matmul.yaml`."""
    from loomrl.run import profile_recipe

    return profile_recipe(
        cfg, lambda flow, c: build(flow, c.demo), lambda: make_items(0, cfg.batch, cfg.run.seed)
    )
