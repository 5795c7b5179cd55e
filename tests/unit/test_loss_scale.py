"""A sequence-mean loss is combined over micro-batches by sequences, not tokens: otherwise the
batch's loss depends on the split (one sequence a micro-batch made it a token mean)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loomrl.algos import AGG_MODES, loss_scale_for


def test_each_aggregation_names_how_micro_batches_combine():
    assert [loss_scale_for(a) for a in AGG_MODES] == ["tokens", "sequences", "sequences"]
    with pytest.raises(ValueError, match="agg='seq-mean'"):
        loss_scale_for("seq-mean")


class _Spy:
    """An engine that records how train_step was asked to combine micro-batches."""

    tokenizer = SimpleNamespace(eos_token_id=0)

    def __init__(self):
        self.scales = []

    def train_step(self, batch, loss_fn, **kw):
        self.scales.append(kw.get("loss_scale"))
        return {"loss": 0.0}


@pytest.mark.parametrize("agg", AGG_MODES)
def test_the_grpo_actor_passes_its_aggregations_loss_scale(agg):
    from loomrl.workers.reasoning import ActorWorker, AlgoConfig, SamplingConfig

    actor = ActorWorker.__new__(ActorWorker)
    actor.engine, actor.algo, actor.sampling = _Spy(), AlgoConfig(agg=agg), SamplingConfig()
    group = {
        "prompt_ids": [1, 2],
        "response_ids": [[3, 4], [5]],
        "advantages": [1.0, -1.0],
        "rewards": [1.0, 0.0],
        "gen_tokens": 3,
        "malformed": 0,
    }
    actor._update([group])
    assert actor.engine.scales == [loss_scale_for(agg)]
