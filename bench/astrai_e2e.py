#!/usr/bin/env python3
"""AstrAI's engine end to end (its scheduler's run_batch, greedy) with the kernels its
astrai/extension/lib holds: run it once with AstrAI's own build there and once with astrai-jit's
(scripts/astrai/harness.py installs either), then compare the two JSON files: same tokens, time.

The model is AstrAI's own AutoRegressiveLM with random weights (seeded) at AstrAI's attention shape
(hidden 1536, 24 query heads, 4 KV heads, head_dim 64), bf16; the prompts are random token ids.

    PYTHONPATH=CHECKOUT python bench/astrai_e2e.py --json FILE [--batch 16 --prompt 512 --tokens 128]
    python bench/astrai_e2e.py --compare OWN.json JIT.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time


def run(args) -> dict:
    import torch

    from astrai.config.model_config import AutoRegressiveLMConfig
    from astrai.extension import ATTN_BACKEND, attn_backend
    from astrai.extension import loader
    from astrai.inference.cache import PagePool
    from astrai.inference.scheduler import InferenceScheduler
    from astrai.model.transformer import AutoRegressiveLM
    from tests.helpers import FakeTokenizer

    served = {n: getattr(loader._modules[n], "served_by", "astrai") for n in loader.KERNEL_NAMES
              if loader.is_available(n)}
    torch.manual_seed(args.seed)
    config = AutoRegressiveLMConfig(vocab_size=32000, hidden_size=1536, num_attention_heads=24,
                                    num_key_value_heads=4, intermediate_size=4096,
                                    max_position_embeddings=args.prompt + args.tokens + 64,
                                    num_hidden_layers=args.layers, rms_norm_eps=1e-5, attn_type="gqa",
                                    ffn_type="mlp")
    model = AutoRegressiveLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, 32000, (args.prompt,), generator=gen).tolist() for _ in range(args.batch)]
    max_seq = args.prompt + args.tokens + 16
    pool = PagePool(n_layers=args.layers, n_kv_heads=4, head_dim=64, max_batch_size=args.batch, max_seq_len=max_seq,
                    device="cuda", dtype=torch.bfloat16)
    sched = InferenceScheduler(model=model, tokenizer=FakeTokenizer(), max_batch_size=args.batch,
                               max_seq_len=max_seq, device="cuda", dtype=torch.bfloat16, cache=pool)
    times = []
    with attn_backend(ATTN_BACKEND.CUDA):
        for _ in range(args.repeats + 1):  # the first run warms up (and captures graphs)
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = sched.run_batch(prompts, max_tokens=args.tokens, temperature=0.0)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    sched.stop()
    tokens = json.dumps(out, sort_keys=True, default=str).encode()
    return dict(kernels=served, seconds=times[1:], best_s=min(times[1:]), batch=args.batch, prompt=args.prompt,
                tokens_per_request=args.tokens, layers=args.layers, tokens_sha256=hashlib.sha256(tokens).hexdigest(),
                outputs=json.loads(json.dumps(out, default=str)), device=torch.cuda.get_device_name())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--compare", nargs=2, metavar=("OWN", "JIT"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.compare:
        own, jit = (json.load(open(p)) for p in args.compare)
        same = own["tokens_sha256"] == jit["tokens_sha256"]
        # Where they differ: how many requests agree, and the first position of each disagreement.
        pairs = list(zip(own["outputs"], jit["outputs"]))
        agree = sum(1 for a, b in pairs if a == b)
        print(f"requests with identical output: {agree} of {len(pairs)}")
        print(f"AstrAI e2e ({own['batch']} requests, prompt {own['prompt']}, {own['tokens_per_request']} new tokens, "
              f"{own['layers']} layers): AstrAI's kernels {own['best_s']:.3f} s, astrai-jit {jit['best_s']:.3f} s "
              f"({own['best_s'] / jit['best_s']:.2f}x); greedy tokens {'identical' if same else 'DIFFER'}")
        return 0 if same else 1
    result = run(args)
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
