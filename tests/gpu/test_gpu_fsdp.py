"""FSDP2 across two GPUs: a trainer group of one process per GPU joins one process group
(``loomrl.distributed``), the engine shards over it, and one optimizer step on half the batch per
rank matches the same step on one GPU over the whole batch; the GRPO recipe runs its actor
sharded. Skipped where fewer than two GPUs are visible."""

from __future__ import annotations

import json

import pytest

import loomrl
from loomrl import wait

pytestmark = pytest.mark.gpu


def _two_gpus() -> bool:
    try:
        import torch

        return torch.cuda.device_count() >= 2
    except Exception:
        return False


needs_two = pytest.mark.skipif(not _two_gpus(), reason="needs two GPUs")


class Trainer(loomrl.Worker):
    def __init__(self, model_dir: str):
        super().__init__()
        from loomrl.distributed import join_process_group
        from loomrl.engines.hf import EngineConfig, HFEngine

        join_process_group(self)
        self.engine = HFEngine(
            EngineConfig(model=model_dir, trainable=True, dtype="float32", lr=1e-3, seed=0)
        )

    def sharded(self) -> bool:
        return bool(self.engine.fsdp)

    def step(self, batch: dict) -> float:
        import torch

        rows = list(range(self.rank, len(batch["prompt_ids"]), self.world_size))
        mine = {
            "prompt_ids": [batch["prompt_ids"][i] for i in rows],
            "response_ids": [batch["response_ids"][i] for i in rows],
            "advantages": torch.tensor([batch["advantages"][i] for i in rows]),
        }

        def loss_fn(logp, mb):
            a = mb["advantages"].reshape(-1, 1).expand_as(logp)
            return -(logp * a * mb["mask"]).sum() / mb["mask"].sum(), {}

        return self.engine.train_step(mine, loss_fn, micro_batch_size=2)["loss"]

    def digest(self) -> dict:
        # Every rank joins the gathers; rank 0's answer is read.
        return {k: float(v.double().sum()) for k, v in self.engine._model_state().items()}


@pytest.fixture(scope="module")
def gpu_cluster():
    c = loomrl.Cluster.start()
    yield c
    c.shutdown()


def _batch(vocab: int) -> dict:
    import random

    rng = random.Random(0)
    n = 8
    return {
        "prompt_ids": [
            [rng.randrange(3, vocab) for _ in range(rng.randint(3, 9))] for _ in range(n)
        ],
        "response_ids": [
            [rng.randrange(3, vocab) for _ in range(rng.randint(2, 7))] for _ in range(n)
        ],
        "advantages": [rng.uniform(-1, 1) for _ in range(n)],
    }


@needs_two
def test_fsdp_step_on_two_gpus_matches_one_gpu(gpu_cluster, tmp_path):
    from loomrl.models import tiny_model

    d = str(tiny_model(tmp_path / "m", hidden=64, layers=2))
    batch = _batch(100)
    one = gpu_cluster.launch(Trainer, 1, d, devices=[0], name="fsdp1")
    two = gpu_cluster.launch(Trainer, 2, d, devices=[0, 1], name="fsdp2")
    try:
        assert wait(one.sharded()) == [False]
        assert wait(two.sharded()) == [True, True]
        before = wait(one.digest())[0]
        assert wait(two.digest())[0] == pytest.approx(before, rel=1e-6)
        wait(one.step(batch))
        wait(two.step(batch))
        after1, after2 = wait(one.digest())[0], wait(two.digest())[0]
        assert after1 != pytest.approx(before, rel=1e-6)  # the step changed the weights
        assert after2 == pytest.approx(after1, rel=1e-4, abs=1e-4)
    finally:
        one.kill()
        two.kill()


@needs_two
def test_grpo_recipe_shards_its_actor_over_two_gpus(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "loomrl.cli",
        "run",
        str(root / "examples/tiny_grpo.yaml"),
        "placement=temporal",
        "steps=2",
        f"output_dir={out}",
        "run.profile=calibrate",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["plan"]["assignment"]["actor"] == [0, 1]
    assert summary["steps"] == 2 and summary["param_sha256"]
