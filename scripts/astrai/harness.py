#!/usr/bin/env python3
"""AstrAI's own tests with astrai-jit standing in for its compiled kernels.

AstrAI (github.com/ViperEkura/AstrAI) is the acceptance test of astrai-jit's AstrAI modules
(python/astrai_jit/astrai_csrc.py): its tests must pass unchanged with them wherever they pass
with AstrAI's own nvcc build. A checkout cannot be fetched in CI, so this takes a path to one
(carried to the GPU machine) and checks that it is one of the pinned commits by the content of
its files.

    harness.py identify CHECKOUT                  which pinned commit the checkout holds
    harness.py build-own CHECKOUT                 AstrAI's own build of its kernels (its setup.py, nvcc)
    harness.py test CHECKOUT {own,jit} JUNIT      its tests with its own kernels, or with astrai-jit's
    harness.py compare OWN_JUNIT JIT_JUNIT        every test passing with its own passes with ours
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# Content fingerprints (harness.py fingerprint) of the two commits that matter: 530d280
# (2026-07-31, the layout the seed documents describe) and 75304d0 (2026-08-22, the flat pool).
PINNED = {
    "530d280": "09a9520c5fb3353378a772113be82a7e692069081c11de40bd17ee18a302c2d4",
    "75304d0": "e152192eaa840f551ded45d9b0ef48e65e5b0fb34b138c06bfd38682c61a1c9b",
}
TESTS = {"530d280": ["tests/extension"], "75304d0": ["tests/extension", "tests/inference"]}
_SKIPPED_DIRS = {"__pycache__", "lib", "build", ".git", ".pytest_cache"}
_KERNEL_SKIP = "CUDA kernels not built"  # AstrAI's skip reason when a kernel module is missing


def fingerprint(checkout: Path) -> str:
    """sha256 over the paths and contents of astrai/, csrc/ and tests/ (compiled modules,
    caches and build trees left out)."""
    digest = hashlib.sha256()
    for top in ("astrai", "csrc", "tests"):
        for root, dirs, files in os.walk(checkout / top):
            dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
            for name in sorted(files):
                if name.endswith((".so", ".pyc")) or ".so." in name:
                    continue
                path = Path(root) / name
                digest.update(str(path.relative_to(checkout)).encode() + b"\0")
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def identify(checkout: Path) -> str:
    found = fingerprint(checkout)
    for commit, expected in PINNED.items():
        if found == expected:
            return commit
    raise SystemExit(f"harness: {checkout} is not a pinned AstrAI commit (fingerprint {found}; pinned: "
                     f"{', '.join(PINNED)})")


def build_own(checkout: Path) -> None:
    """AstrAI's own build of its kernels, for the GPU in this machine."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    env = dict(os.environ, CSRC_KERNELS="true", ASTRAI_CUDA_ARCH=f"{major}{minor}",
               MAX_JOBS=os.environ.get("MAX_JOBS", "8"))
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=checkout, env=env, check=True)


def test(checkout: Path, kernels: str, junit: Path, extra: list) -> int:
    commit = identify(checkout)
    install = [sys.executable, "-m", "astrai_jit.astrai_install", "--astrai", str(checkout)]
    subprocess.run(install + (["--uninstall"] if kernels == "own" else []), check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])))
    # Every kernel module must load: AstrAI's tests otherwise skip, or run its torch fallback. With
    # astrai-jit's kernels none may be AstrAI's own build: what runs is what a user without nvcc gets.
    probe = ("from astrai.extension import loader; missing = [n for n in loader.KERNEL_NAMES if not "
             "loader.is_available(n)]; by = {n: getattr(loader._modules[n], 'served_by', 'astrai') for n in "
             "loader.KERNEL_NAMES if loader.is_available(n)}; print('kernels:', ' '.join(f'{n}={b}' for n, b in "
             "by.items())); assert not missing and loader.KERNEL_NAMES, ('not available', missing, "
             f"loader.KERNEL_NAMES); own = [n for n, b in by.items() if b != 'astrai-jit']; assert {kernels == 'own'} "
             "or not own, ('AstrAI build still serving', own)")
    subprocess.run([sys.executable, "-c", probe], cwd=checkout, env=env, check=True)
    command = [sys.executable, "-m", "pytest", *TESTS[commit], "-p", "no:cacheprovider", "-q", "-rs",
               f"--junitxml={junit}", *extra]
    print(f"harness: AstrAI {commit}, {kernels} kernels: {' '.join(command)}", flush=True)
    return subprocess.run(command, cwd=checkout, env=env).returncode


def _outcomes(junit: Path) -> dict:
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[name] = ("failed", "")
        elif case.find("skipped") is not None:
            outcomes[name] = ("skipped", case.find("skipped").get("message", ""))
        else:
            outcomes[name] = ("passed", "")
    return outcomes


def compare(own_junit: Path, jit_junit: Path) -> int:
    own, jit = _outcomes(own_junit), _outcomes(jit_junit)
    bad = []
    for name, (outcome, _) in sorted(own.items()):
        theirs = jit.get(name, ("missing", ""))
        if outcome == "passed" and theirs[0] != "passed":
            bad.append(f"{name}: passed with AstrAI's kernels, {theirs[0]} with astrai-jit's {theirs[1]}")
    for name, (outcome, why) in sorted(jit.items()):
        if outcome == "skipped" and _KERNEL_SKIP in why:
            bad.append(f"{name}: skipped with astrai-jit ({why})")
    for label, table in (("AstrAI's kernels", own), ("astrai-jit", jit)):
        tally = {o: sum(1 for x, _ in table.values() if x == o) for o in ("passed", "failed", "skipped")}
        print(f"harness: {label}: {tally['passed']} passed, {tally['failed']} failed, {tally['skipped']} skipped")
    for line in bad:
        print(f"harness: FAIL {line}")
    print("harness: " + ("every test that passes with AstrAI's kernels passes with astrai-jit's" if not bad
                         else f"{len(bad)} regressions"))
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in ("identify", "build-own", "fingerprint"):
        sub.add_parser(verb).add_argument("checkout", type=Path)
    t = sub.add_parser("test")
    t.add_argument("checkout", type=Path)
    t.add_argument("kernels", choices=("own", "jit"))
    t.add_argument("junit", type=Path)
    t.add_argument("pytest_args", nargs="*")
    c = sub.add_parser("compare")
    c.add_argument("own_junit", type=Path)
    c.add_argument("jit_junit", type=Path)
    args = parser.parse_args()
    if args.verb == "fingerprint":
        print(fingerprint(args.checkout))
    elif args.verb == "identify":
        print(identify(args.checkout))
    elif args.verb == "build-own":
        identify(args.checkout)
        build_own(args.checkout)
    elif args.verb == "test":
        return test(args.checkout, args.kernels, args.junit, args.pytest_args)
    else:
        return compare(args.own_junit, args.jit_junit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
