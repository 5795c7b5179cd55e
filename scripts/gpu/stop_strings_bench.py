"""What stop strings cost generation: the same batch with and without them, per generation path.

    python scripts/gpu/stop_strings_bench.py --model-dir DIR [--batch 64] [--new-tokens 128]

A random model never writes the strings, so every row runs to --new-tokens either way and the
difference is the checking alone (HF's stop-string criterion on the hf paths, loomrl's StopText
on the loop path). Prints tokens/s per path and the ratio with / without; writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--impls", default="hf_static,hf,loop")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from loomrl.engines import EngineConfig, HFEngine

    stops = ("</search>", "</answer>")
    rows = []
    for impl in args.impls.split(","):
        eng = HFEngine(EngineConfig(model=args.model_dir, trainable=False, generate_impl=impl))
        prompts = [
            eng.encode_prompt(f"question {i}: where was person {i} born?")
            for i in range(args.batch)
        ]
        kw = dict(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
        for label, extra in (("plain", {}), ("stop_strings", {"stop_strings": stops})):
            eng.generate(prompts, seed=0, **kw, **extra)  # warm-up (compilation, caches)
            times = []
            for r in range(args.reps):
                if eng.device.type == "cuda":
                    import torch

                    torch.cuda.synchronize()
                t = time.perf_counter()
                out = eng.generate(prompts, seed=r + 1, **kw, **extra)
                times.append(time.perf_counter() - t)
            secs = statistics.median(times)
            rows.append(
                {
                    "impl": impl,
                    "variant": label,
                    "seconds": secs,
                    "tokens_per_s": out.num_tokens / secs,
                    "tokens": out.num_tokens,
                }
            )
            print(
                f"{impl:>9} {label:>12}: {secs:.3f} s, {out.num_tokens / secs:,.0f} tokens/s",
                flush=True,
            )
        del eng
    for impl in args.impls.split(","):
        a, b = (
            next(r for r in rows if r["impl"] == impl and r["variant"] == v)
            for v in ("plain", "stop_strings")
        )
        print(f"{impl}: stop_strings / plain time {b['seconds'] / a['seconds']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
