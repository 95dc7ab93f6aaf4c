"""Make AstrAI run on astrai-jit's kernels:  ``python -m astrai_jit.astrai_install``

AstrAI loads each CUDA kernel as a compiled module from ``astrai/extension/lib/`` (what its
``CSRC_KERNELS=true`` build puts there). This command puts astrai-jit's compiled stand-in there
under each kernel's name instead (``astrai_jit/astrai_csrc.py`` holds the functions, with the
signatures of AstrAI's ``csrc/`` at its 2026-07 and 2026-08 interfaces), so ``import astrai``
finds them and AstrAI runs unchanged; where AstrAI loads its FP8 GEMM module, ``fp8_mm`` is put
there too (``astrai_jit/astrai_fp8.py``). A module AstrAI built itself under the same name is moved
aside (``<file>.astrai-own``) and put back by ``--uninstall``; other files are left alone.

    python -m astrai_jit.astrai_install             # the astrai package Python imports
    python -m astrai_jit.astrai_install --astrai ~/src/AstrAI
    python -m astrai_jit.astrai_install --status
    python -m astrai_jit.astrai_install --uninstall
"""
from __future__ import annotations

import argparse
import filecmp
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

KERNEL_NAMES = ("attn_decode", "attn_prefill", "attn_paged_decode", "attn_paged_prefill", "rotary_emb")
# AstrAI's FP8 GEMM module (2026-08 on: astrai/extension/ops/fp8.py loads it); installed only into
# an AstrAI that has it, so that an earlier one sees no kernel its source does not name.
FP8_KERNEL = "fp8_mm"
ALL_NAMES = KERNEL_NAMES + (FP8_KERNEL,)
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # this interpreter's: .cpython-311-x86_64-linux-gnu.so
_ASIDE = ".astrai-own"


class InstallError(RuntimeError):
    pass


def stand_in_path() -> Path:
    """The compiled stand-in module shipped in this package."""
    # This interpreter's suffix, or .abi3.so in a stable-ABI wheel (CPython 3.12+).
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = Path(__file__).with_name("_astrai_kernel_module" + suffix)
        if path.is_file():
            return path
    path = Path(__file__).with_name("_astrai_kernel_module" + _SUFFIX)
    if not path.is_file():
        raise InstallError(f"{path} is missing: this astrai-jit was built without its AstrAI module "
                           f"(rebuild the wheel)")
    return path


def find_lib_dir(astrai: Optional[str] = None) -> Path:
    """``astrai/extension/lib`` of a checkout or package directory, or of the ``astrai`` package
    that this Python imports (found without importing it)."""
    if astrai is None:
        spec = importlib.util.find_spec("astrai")
        if spec is None or not spec.submodule_search_locations:
            raise InstallError("no `astrai` package is importable here (allowed: install AstrAI, put its checkout "
                               "on PYTHONPATH, or pass --astrai PATH)")
        package = Path(list(spec.submodule_search_locations)[0])
    else:
        root = Path(astrai).expanduser()
        package = root / "astrai" if (root / "astrai" / "extension").is_dir() else root
    lib = package / "extension" / "lib"
    if not (package / "extension" / "loader.py").is_file():
        raise InstallError(f"{package} is not an AstrAI package with a kernel loader (expected "
                           f"{package / 'extension' / 'loader.py'})")
    if not lib.is_dir():
        raise InstallError(f"{lib} is missing (AstrAI keeps its compiled kernels there)")
    return lib


def _target(lib: Path, name: str) -> Path:
    return lib / (name + _SUFFIX)


def _is_ours(path: Path, stand_in: Path) -> bool:
    return path.is_file() and not path.is_symlink() and filecmp.cmp(path, stand_in, shallow=False)


def served_names(lib: Path) -> tuple:
    """The kernel modules this AstrAI loads (its lib directory's package tells)."""
    return ALL_NAMES if (lib.parent / "ops" / "fp8.py").is_file() else KERNEL_NAMES


def install(lib: Path) -> List[str]:
    stand_in = stand_in_path()
    done = []
    for name in served_names(lib):
        target = _target(lib, name)
        if _is_ours(target, stand_in):
            done.append(f"{name}: already astrai-jit's")
            continue
        if target.exists() or target.is_symlink():
            aside = target.with_name(target.name + _ASIDE)
            if aside.exists():
                raise InstallError(f"{target} exists and so does {aside}: move one of them away first")
            os.replace(target, aside)
            done.append(f"{name}: astrai-jit's (AstrAI's own build kept as {aside.name})")
        else:
            done.append(f"{name}: astrai-jit's")
        # Written beside the target and renamed into place: a concurrent `import astrai` sees the
        # old module or the new one, never a partial file.
        fd, temp = tempfile.mkstemp(dir=lib, prefix=f".{name}.")
        os.close(fd)
        shutil.copyfile(stand_in, temp)
        os.chmod(temp, 0o755)
        os.replace(temp, target)
    return done


def uninstall(lib: Path) -> List[str]:
    stand_in = stand_in_path()
    done = []
    for name in ALL_NAMES:
        target = _target(lib, name)
        aside = target.with_name(target.name + _ASIDE)
        if _is_ours(target, stand_in):
            target.unlink()
            if aside.exists():
                os.replace(aside, target)
                done.append(f"{name}: AstrAI's own build restored")
            else:
                done.append(f"{name}: removed")
        elif target.exists():
            done.append(f"{name}: not astrai-jit's, left alone")
    return done


def status(lib: Path) -> List[str]:
    stand_in = stand_in_path()
    lines = []
    for name in served_names(lib):
        target = _target(lib, name)
        state = ("astrai-jit" if _is_ours(target, stand_in) else "AstrAI's own build" if target.exists()
                 else "not built (AstrAI falls back to torch)")
        lines.append(f"{name}: {state}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m astrai_jit.astrai_install",
                                     description="Serve AstrAI's CUDA kernels with astrai-jit.")
    parser.add_argument("--astrai", metavar="PATH", help="an AstrAI checkout or its astrai/ package directory "
                        "(default: the astrai package this Python imports)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--uninstall", action="store_true", help="remove astrai-jit's modules, restore AstrAI's")
    action.add_argument("--status", action="store_true", help="say what serves each kernel name")
    args = parser.parse_args(argv)
    try:
        lib = find_lib_dir(args.astrai)
        lines = status(lib) if args.status else uninstall(lib) if args.uninstall else install(lib)
    except (InstallError, OSError) as error:
        print(f"astrai_install: error: {error}", file=sys.stderr)
        return 1
    print(f"{lib}:")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
