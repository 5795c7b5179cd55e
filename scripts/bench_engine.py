"""Time HFEngine generation (own loop vs transformers' generate) and a training step.

    python scripts/bench_engine.py --model smollm2-135m-instruct --batch 8 16 --new 64 --train
    python scripts/bench_engine.py --random-like smollm2-135m --batch 64 --prompt-len 64 --new 128

Prints one JSON line per measurement. ``--random-like`` builds a random model of a known shape
(for machines where the GGUF cannot travel); prompts are then random tokens of
``--prompt-len``. Impl ``hf_static`` calls ``model.generate`` with a static KV cache
(transformers compiles the decode step on GPU; ``first_s`` includes that compile).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--random-like", default=None, help="smollm2-135m | 0.5b")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=0, help="random prompts of this length")
    ap.add_argument("--impl", nargs="+", default=["loop", "hf"])
    ap.add_argument("--no-ignore-eos", action="store_true", help="stop at EOS (variable length)")
    ap.add_argument("--train", action="store_true", help="also time forward+backward on 8 x 256")
    ap.add_argument("--train-mbs", type=int, nargs="+", default=[8])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--rollout", action="store_true", help="inference-only engine (bf16 weights on GPU)"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = ap.parse_args()

    import torch

    from loomrl.engines import EngineConfig, HFEngine
    from loomrl.engines.offload import rss_bytes

    model = args.model
    if args.random_like:
        from loomrl.models import random_model_like

        t0 = time.perf_counter()
        model = str(random_model_like(tempfile.mkdtemp() + "/m", args.random_like))
        emit(event="build_random", s=round(time.perf_counter() - t0, 2))
    t0 = time.perf_counter()
    eng = HFEngine(
        EngineConfig(model=model, lr=1e-6, num_threads=args.threads, trainable=not args.rollout)
    )
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None
    emit(
        event="load",
        s=round(time.perf_counter() - t0, 2),
        device=str(eng.device),
        threads=torch.get_num_threads(),
        loadavg=load,
        params=eng.num_parameters(),
    )
    vocab = eng.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    questions = [
        f"What is {a} + {b}? Answer with a number."
        for a, b in zip(range(11, 99, 7), range(3, 90, 5), strict=False)
    ]
    sync = torch.cuda.synchronize if eng.device.type == "cuda" else (lambda: None)
    for b in args.batch:
        if args.prompt_len:
            prompts = [
                torch.randint(0, min(vocab, 1000), (args.prompt_len,), generator=g).tolist()
                for _ in range(b)
            ]
        else:
            prompts = [
                eng.encode_prompt(questions[i % len(questions)] + " " * (i % 3)) for i in range(b)
            ]
        for impl in args.impl:
            best = None
            for r in range(args.repeats + 1):  # the first run warms up (and compiles)
                eng.config.generate_impl = impl
                res = eng.generate(
                    prompts,
                    max_new_tokens=args.new,
                    temperature=1.0,
                    seed=r,
                    ignore_eos=not args.no_ignore_eos,
                )
                dt, n = res.time_s, res.num_tokens
                if r == 0:
                    first = dt
                if r and (best is None or n / dt > best[0]):
                    best = (n / dt, n, dt)
            emit(
                event="generate",
                impl=impl,
                batch=b,
                new=args.new,
                tokens=best[1],
                first_s=round(first, 2),
                s=round(best[2], 3),
                tok_per_s=round(best[0], 1),
            )
    if args.train:
        prompts = [torch.randint(0, vocab, (128,), generator=g).tolist() for _ in range(8)]
        responses = [torch.randint(0, vocab, (128,), generator=g).tolist() for _ in range(8)]
        batch = {"prompt_ids": prompts, "response_ids": responses, "adv": [1.0] * 8}

        def loss_fn(logp, mb):
            m = mb["mask"]
            return -(logp * m * mb["adv"][:, None]).sum() / m.sum(), {}

        for mbs in args.train_mbs:
            for r in range(args.repeats):
                if eng.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                st = eng.train_step(batch, loss_fn, micro_batch_size=mbs)
                peak = (
                    torch.cuda.max_memory_allocated() / 2**30 if eng.device.type == "cuda" else None
                )
                emit(
                    event="train_step",
                    rows=8,
                    tokens_per_row=256,
                    micro_batch_size=mbs,
                    repeat=r,
                    s=round(st["time_s"], 3),
                    rss_mb=round(rss_bytes() / 2**20),
                    gpu_peak_gib=peak,
                )
        sync()
        t = time.perf_counter()
        eng.logprobs(prompts, responses, micro_batch_size=8)
        sync()
        emit(event="logprobs", rows=8, tokens_per_row=256, s=round(time.perf_counter() - t, 3))
        off = eng.offload()
        on = eng.onload()
        emit(
            event="offload",
            **{k: round(v, 2) for k, v in off.items()},
            onload_s=round(on["time_s"], 2),
            rss_after_onload_mb=round(on["rss_mb"]),
        )


if __name__ == "__main__":
    sys.exit(main())
