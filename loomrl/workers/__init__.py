"""RL components as loomrl workers: rollout, reward, reference, actor (reasoning RL)."""
