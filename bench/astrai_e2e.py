#!/usr/bin/env python3
"""AstrAI's engine end to end (its scheduler's run_batch, greedy) with the kernels its
astrai/extension/lib holds: run it once with AstrAI's own build there and once with astrai-jit's
(scripts/astrai/harness.py installs either), then compare the JSON files: same tokens, time.

The model is AstrAI's own AutoRegressiveLM at AstrAI's attention shape (hidden 1536, 24 query
heads, 4 KV heads, head_dim 64), bf16, with random weights (seeded) or with the weights --train
wrote.

    PYTHONPATH=CHECKOUT python bench/astrai_e2e.py --json FILE [--batch 16 --prompt 512 --tokens 128]
    PYTHONPATH=CHECKOUT python bench/astrai_e2e.py --backend torch --json TORCH.json
    PYTHONPATH=CHECKOUT python bench/astrai_e2e.py --train 5000 --layers 2 --weights W.pt
    PYTHONPATH=CHECKOUT python bench/astrai_e2e.py --train 5000 --layers 2 --init W.pt --weights W2.pt
    PYTHONPATH=CHECKOUT python bench/astrai_e2e.py --weights W.pt --layers 2 --json FILE
    python bench/astrai_e2e.py --compare OWN.json JIT.json [TORCH.json]

Random weights leave the top logits close, so two correct bf16 kernels can pick different greedy
tokens: with those, --compare says how often each kernel set agrees with a third run on AstrAI's
torch backend (SDPA) and where they part. --train gives the tokens a reason: it trains the model
(AstrAI's training forward, torch attention, never the kernels under test) to continue a block
of random tokens that repeats with a period (--periods, 64 by default), which only attention
reaching a period back can do; the prompts are then such blocks. Once it has learnt the task
(each JSON says how many generated tokens continue the period; --compare says when too few do)
its greedy tokens are decisive, so every correct kernel set gives the same ones, and a wrong
attention kernel breaks the pattern. Training stops at --train steps, --train-seconds or a
loss of 0.01; --init goes on from an earlier run's weights, so that it can span device calls.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time


# The trained model's blocks draw from these ids (0-2 are special): enough that a block rarely
# holds a token twice, which would leave its successor ambiguous.
PATTERN_TOKENS = (3, 8195)


def build_model(args, dtype):
    import torch

    from astrai.config.model_config import AutoRegressiveLMConfig
    from astrai.model.transformer import AutoRegressiveLM

    torch.manual_seed(args.seed)
    config = AutoRegressiveLMConfig(vocab_size=32000, hidden_size=1536, num_attention_heads=24,
                                    num_key_value_heads=4, intermediate_size=4096,
                                    max_position_embeddings=args.prompt + args.tokens + 64,
                                    num_hidden_layers=args.layers, rms_norm_eps=1e-5, attn_type="gqa",
                                    ffn_type="mlp")
    return AutoRegressiveLM(config).to(device="cuda", dtype=dtype)


def periodic(gen, length: int, period: int):
    """A block of random pattern tokens, repeated to the length."""
    import torch

    block = torch.randint(*PATTERN_TOKENS, (period,), generator=gen)
    return block.repeat(length // period + 1)[:length]


def train(args) -> None:
    """Trains the model to continue a repeating block and writes its bf16 weights to --weights."""
    import torch
    import torch.nn.functional as F

    model = build_model(args, torch.float32).train()
    if args.init:  # go on from weights an earlier --train wrote
        model.load_state_dict(torch.load(args.init, map_location="cuda"))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + 1)
    length = args.prompt + args.tokens
    start = time.perf_counter()
    step, loss = 0, None
    while step < args.train and time.perf_counter() - start < args.train_seconds:
        step += 1
        periods = torch.randint(args.periods[0], args.periods[1] + 1, (args.train_batch,), generator=gen).tolist()
        ids = torch.stack([periodic(gen, length, p) for p in periods]).cuda()
        # Only the tokens a past block determines are learnable: from each row's second block on.
        known = torch.arange(1, length, device="cuda")[None, :] >= torch.tensor(periods, device="cuda")[:, None]
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, step / 50)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids[:, :-1])["logits"]
        loss = F.cross_entropy(logits.float()[known], ids[:, 1:][known])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            hits = (logits.detach().argmax(-1)[known] == ids[:, 1:][known]).float().mean().item()
            print(f"step {step}: loss {loss.item():.4f}, next token right {hits:.1%} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            if loss.item() < 0.01:
                break
    torch.save({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}, args.weights)
    print(f"trained {step} steps in {time.perf_counter() - start:.0f} s, final loss {loss.item():.4f} -> {args.weights}")


def run(args) -> dict:
    import torch

    from astrai.extension import ATTN_BACKEND, attn_backend
    from astrai.extension import loader
    from astrai.inference.cache import PagePool
    from astrai.inference.scheduler import InferenceScheduler
    from tests.helpers import FakeTokenizer

    served = {n: getattr(loader._modules[n], "served_by", "astrai") for n in loader.KERNEL_NAMES
              if loader.is_available(n)}
    model = build_model(args, torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(args.seed)
    expected = None
    if args.weights:
        model.load_state_dict(torch.load(args.weights, map_location="cuda"))
        periods = torch.randint(args.periods[0], args.periods[1] + 1, (args.batch,), generator=gen).tolist()
        rows = [periodic(gen, args.prompt + args.tokens, p).tolist() for p in periods]
        prompts = [r[:args.prompt] for r in rows]
        expected = [r[args.prompt:] for r in rows]
    else:
        prompts = [torch.randint(3, 32000, (args.prompt,), generator=gen).tolist() for _ in range(args.batch)]
    max_seq = args.prompt + args.tokens + 16
    pool = PagePool(n_layers=args.layers, n_kv_heads=4, head_dim=64, max_batch_size=args.batch, max_seq_len=max_seq,
                    device="cuda", dtype=torch.bfloat16)
    sched = InferenceScheduler(model=model, tokenizer=FakeTokenizer(), max_batch_size=args.batch,
                               max_seq_len=max_seq, device="cuda", dtype=torch.bfloat16, cache=pool)
    times = []
    with attn_backend(ATTN_BACKEND.TORCH_NATIVE if args.backend == "torch" else ATTN_BACKEND.CUDA):
        for _ in range(args.repeats + 1):  # the first run warms up (and captures graphs)
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = sched.run_batch(prompts, max_tokens=args.tokens, temperature=0.0)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    sched.stop()
    tokens = json.dumps(out, sort_keys=True, default=str).encode()
    follows = None
    if expected is not None:  # generated tokens that continue the prompt's period
        follows = sum(sum(a == b for a, b in zip(o, e)) for o, e in zip(out, expected))
    return dict(kernels=served if args.backend == "cuda" else {"attention": "torch"}, seconds=times[1:],
                best_s=min(times[1:]), batch=args.batch, prompt=args.prompt, tokens_per_request=args.tokens,
                layers=args.layers, weights=args.weights, follows_period=follows,
                tokens_sha256=hashlib.sha256(tokens).hexdigest(), outputs=json.loads(json.dumps(out, default=str)),
                device=torch.cuda.get_device_name())


def first_divergence(a, b):
    """The first position where two requests' outputs differ, None where they agree."""
    if a == b:
        return None
    a, b = (x if isinstance(x, list) else str(x).split() for x in (a, b))
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def agreement(one: dict, other: dict) -> str:
    """How many requests two runs agree on, and where the others part (median first divergence)."""
    parts = [first_divergence(a, b) for a, b in zip(one["outputs"], other["outputs"])]
    apart = sorted(p for p in parts if p is not None)
    median = apart[len(apart) // 2] if apart else None
    return (f"{len(parts) - len(apart)} of {len(parts)} requests identical; the others part at tokens {apart}"
            f" (median {median})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--compare", nargs="+", metavar="RUN", help="OWN.json JIT.json [TORCH.json]")
    parser.add_argument("--backend", choices=("cuda", "torch"), default="cuda",
                        help="cuda: the compiled kernels in astrai/extension/lib; torch: AstrAI's torch backend")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--weights", help="with --train: where to write the trained weights; else: the weights to load")
    parser.add_argument("--train", type=int, default=0, metavar="STEPS", help="train the copy task for STEPS steps")
    parser.add_argument("--train-seconds", type=float, default=240, help="stop training after this long")
    parser.add_argument("--periods", type=int, nargs=2, default=(64, 64), metavar=("LO", "HI"),
                        help="the blocks' periods (training and prompts): one fixed period is learnt fastest "
                             "(a head attending a fixed distance back); a range needs induction")
    parser.add_argument("--init", help="with --train: start from these weights (an earlier --train's)")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    if args.init and not args.train:
        parser.error("--init goes with --train (it is where training starts from); to run a model, give --weights")
    if args.train:
        if not args.weights:
            parser.error("--train needs --weights FILE to write the trained weights to")
        train(args)
        return 0
    if args.compare:
        if len(args.compare) not in (2, 3):
            parser.error(f"--compare takes OWN.json JIT.json [TORCH.json], got {len(args.compare)} files")
        own, jit = (json.load(open(p)) for p in args.compare[:2])
        same = own["tokens_sha256"] == jit["tokens_sha256"]
        print(f"own vs astrai-jit: {agreement(own, jit)}")
        for name, one in (("own", own), ("astrai-jit", jit)):
            if one.get("follows_period") is not None:
                made = sum(len(o) for o in one["outputs"])
                print(f"{name}: {one['follows_period']} of {made} generated tokens continue the prompts' period")
                if one["follows_period"] < 0.95 * made:
                    print(f"{name}: the model does not continue the period (under 95%): its tokens are not decisive,"
                          " so their agreement proves little")
        if len(args.compare) == 3:
            reference = json.load(open(args.compare[2]))
            print(f"own vs torch:      {agreement(own, reference)}")
            print(f"astrai-jit vs torch: {agreement(jit, reference)}")
        print(f"AstrAI e2e ({own['batch']} requests, prompt {own['prompt']}, {own['tokens_per_request']} new tokens, "
              f"{own['layers']} layers): AstrAI's kernels {own['best_s']:.3f} s, astrai-jit {jit['best_s']:.3f} s "
              f"({own['best_s'] / jit['best_s']:.2f}x); greedy tokens {'identical' if same else 'DIFFER'}")
        return 0 if same else 1
    result = run(args)
    if args.json:  # the outputs go to the file; a line says what ran
        with open(args.json, "w") as f:
            json.dump(result, f)
        print(f"astrai_e2e: kernels {result['kernels']}, best {result['best_s']:.3f} s of {result['seconds']}, "
              f"tokens sha256 {result['tokens_sha256'][:16]} -> {args.json}")
    else:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
