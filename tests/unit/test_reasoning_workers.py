"""Reasoning workers, in-process on stand-in engines: a sequence-mean loss is combined over
micro-batches by sequences, not tokens (otherwise the batch's loss depends on the split: one
sequence a micro-batch made it a token mean), and pieces of a generation chunk draw apart."""

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


class _GenSpy:
    """An engine that records the seed of each generate call."""

    version = 0

    def __init__(self):
        self.seeds = []

    def generate(self, prompts, seed, **kw):
        self.seeds.append(seed)
        return SimpleNamespace(
            response_ids=[[1] for _ in prompts], response_logprobs=[[0.0] for _ in prompts]
        )

    def decode(self, ids):
        return "x"


def test_pieces_of_one_generation_chunk_draw_from_seeds_of_their_own():
    """gen_groups=4 under a plan of micro-batch 2: the chunk of groups 0-3 arrives in two calls,
    and the two must not share their random draws."""
    from loomrl.workers.reasoning import RolloutWorker, SamplingConfig

    roll = RolloutWorker.__new__(RolloutWorker)
    roll.sampling, roll.seed = SamplingConfig(group_size=2, gen_groups=4), 0
    roll.engine = _GenSpy()
    items = [{"index": i, "step": 0, "prompt_ids": [i]} for i in range(4)]
    roll.generate(items[:2])
    roll.generate(items[2:])
    roll.generate(items)  # the whole chunk in one call: one seed
    first, second, whole = roll.engine.seeds
    assert first != second
    assert whole == first  # a whole chunk draws as its first piece did
