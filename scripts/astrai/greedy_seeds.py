#!/usr/bin/env python3
"""AstrAI 530d280's `test_run_batch_cuda_matches_torch_greedy` over seeded random models.

That test draws an unseeded random model (2 layers, hidden 128) and asks AstrAI's torch backend
and the compiled kernel modules for the same 5 greedy tokens; a random model's near-ties make it
pass or fail by draw. Run over many seeds with AstrAI's own modules and then with astrai-jit's
(`python -m astrai_jit.astrai_install --astrai CHECKOUT [--uninstall]` between the two), it says
how often each kernel set fails it, seed by seed. The test's body runs unchanged.

    cd CHECKOUT && PYTHONPATH=. python PATH/greedy_seeds.py [--first 0] [--count 30] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--count", type=int, default=30, help="how many seeds")
    parser.add_argument("--json", help="write {seed: outcome} here")
    args = parser.parse_args()
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")

    import torch

    from astrai.config.model_config import AutoRegressiveLMConfig
    from astrai.extension import loader
    from astrai.model.transformer import AutoRegressiveLM
    from tests.extension.conftest import CFG
    from tests.extension.test_backend_equivalence import test_run_batch_cuda_matches_torch_greedy as body

    served = {n: getattr(loader._modules[n], "served_by", "astrai") for n in loader.KERNEL_NAMES
              if loader.is_available(n)}
    missing = [n for n in loader.KERNEL_NAMES if n not in served]
    if missing:
        raise SystemExit(f"greedy_seeds: kernel modules not available: {missing}; the test would skip")
    print("kernels:", " ".join(f"{n}={b}" for n, b in served.items()), flush=True)
    outcomes = {}
    for seed in range(args.first, args.first + args.count):
        torch.manual_seed(seed)
        model = AutoRegressiveLM(AutoRegressiveLMConfig(**CFG)).to(device="cuda", dtype=torch.bfloat16).eval()
        try:
            body((model, None))
            outcomes[seed] = "passed"
        except AssertionError as failure:
            outcomes[seed] = f"failed: {str(failure)[:200]}"
        print(seed, outcomes[seed], flush=True)
    passed = sum(o == "passed" for o in outcomes.values())
    print(f"greedy_seeds: passed {passed} of {len(outcomes)}; failed at seeds "
          f"{[s for s, o in outcomes.items() if o != 'passed']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernels": served, "outcomes": outcomes}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
