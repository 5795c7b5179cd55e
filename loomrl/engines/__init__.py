"""Model engines: generation, log-probs and training steps behind one small interface.

``HFEngine`` (Hugging Face causal LMs, FSDP2 on multi-GPU groups) and ``HFValueEngine``
(the PPO critic). Importing this package imports torch.
"""

from loomrl.engines.hf import EngineConfig, GenerationOutput, HFEngine, HFValueEngine

__all__ = ["EngineConfig", "GenerationOutput", "HFEngine", "HFValueEngine"]
