"""Held-out accuracy of a model on search_qa with the BM25 tool, per number of look-ups.

    python scripts/search_eval.py MODEL_DIR [--hops mixed] [--eval-size 48] [--instruction search_multi]

MODEL_DIR: a Hugging Face directory (``loomrl export RUN_DIR OUT_DIR`` writes one) or
``smollm2-135m-instruct``. Greedy multi-turn rollouts in this process (no Ray), the same turns,
tool and scoring as the agentic_search recipe's evaluation. Prints one line per hop count and
the overall accuracy, and writes JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model")
    p.add_argument("--hops", default="mixed", choices=("1", "2", "mixed"))
    p.add_argument("--eval-size", type=int, default=48)
    p.add_argument("--instruction", default="search_multi")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--turn-tokens", type=int, default=24)
    p.add_argument("--max-response-tokens", type=int, default=256)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import torch

    from loomrl.agentic import AgentConfig, agent_rollout
    from loomrl.engines import EngineConfig, HFEngine
    from loomrl.models import resolve_model
    from loomrl.reasoning import Encoder
    from loomrl.tasks.search_qa import ANSWER_CLOSE, SEARCH_CLOSE, SearchQATask
    from loomrl.tools import SearchIndex

    torch.manual_seed(0)
    hops = args.hops if args.hops == "mixed" else int(args.hops)
    task = SearchQATask(hops=hops, eval_size=args.eval_size)
    index = SearchIndex(task.corpus(), k=2)
    engine = HFEngine(EngineConfig(model=str(resolve_model(args.model)), trainable=False))
    encode = Encoder(args.model, args.instruction, "<search>")
    cfg = AgentConfig(
        max_turns=args.max_turns,
        turn_tokens=args.turn_tokens,
        max_response_tokens=args.max_response_tokens,
        response_prefix="<search>",
    )
    exs = task.eval_set()

    def generate(rows, max_new, seed):
        return engine.generate(
            rows,
            max_new_tokens=max_new,
            temperature=0.0,
            seed=seed,
            stop_strings=(SEARCH_CLOSE, ANSWER_CLOSE),
        )

    trajs = []
    for i in range(0, len(exs), 16):
        trajs += agent_rollout(
            [encode(e.question) for e in exs[i : i + 16]],
            generate=generate,
            submit=lambda queries: lambda: index.search(queries),
            encode=lambda text: engine.tokenizer.encode(text, add_special_tokens=False),
            decode=engine.decode,
            cfg=cfg,
            seed=0,
        )
    rows = [
        {"hops": e.meta["hops"], "correct": task.score(t.text, e).reward, "searches": t.searches}
        for e, t in zip(exs, trajs, strict=True)
    ]
    result = {"model": args.model, "args": vars(args), "by_hops": {}}
    for h in sorted({r["hops"] for r in rows}):
        mine = [r for r in rows if r["hops"] == h]
        acc = sum(r["correct"] for r in mine) / len(mine)
        searches = sum(r["searches"] for r in mine) / len(mine)
        result["by_hops"][h] = {"n": len(mine), "accuracy": acc, "searches": searches}
        print(f"hops {h}: accuracy {acc:.3f} over {len(mine)}, {searches:.2f} searches each")
    result["accuracy"] = sum(r["correct"] for r in rows) / len(rows)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"accuracy: {result['accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
