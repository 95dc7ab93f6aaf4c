"""The JIT from Python: warm the disk cache, read its state, list loaded variants.

``warm`` and ``cache_info`` run the packaged ``astrai-jit`` CLI, so they make exactly the CLI's
choices and read the ``ASTRAI_JIT_*`` variables the same way (the child inherits the
environment).
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Dict, Iterable, List, Optional, Sequence, Union

from . import _loader

_C = _loader.import_extension()


def cli_path() -> str:
    """Path of the packaged ``astrai-jit`` executable."""
    # Next to the extension module (an editable install keeps the sources elsewhere).
    return os.path.join(os.path.dirname(os.path.abspath(_C.__file__)), "_bin", "astrai-jit")


def cli_env(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment for the CLI: the caller's, with libnvrtc's directory on the library path."""
    env = dict(os.environ if base is None else base)
    nvrtc = _loader.find_nvrtc()
    if nvrtc:
        directory = os.path.dirname(nvrtc)
        current = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = directory + (os.pathsep + current if current else "")
    return env


def run_cli(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Runs ``astrai-jit ARGS``; with ``check``, exit code 1 or 2 raises astrai_jit.Error with
    the CLI's messages."""
    result = subprocess.run([cli_path(), *args], env=cli_env(), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise _C.Error(f"astrai-jit {' '.join(args)} exited with {result.returncode}:\n"
                       f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def _join(name: str, values: Union[None, str, int, Iterable]) -> List[str]:
    if values is None:
        return []
    if isinstance(values, (str, int)):
        values = [values]
    items = [str(v) for v in values]
    return [f"--{name}", ",".join(items)] if items else []


# The CLI's summary lines (tools/cli/warm.cpp); the byte count appears only when something was
# compiled.
_SUMMARY = re.compile(r"warm: (\d+) variants?, (\d+) compiled(?: \((\d+) bytes\))?, (\d+) already cached, "
                      r"(\d+) failed, ([0-9.]+) s wall")
_DRY = re.compile(r"warm: (\d+) variants?, (\d+) already cached \(dry run")


def warm(*, arch=None, kernels=None, dtypes=None, head_dims=None, page_sizes=None, group_sizes=None,
         features=None, hopper: Optional[bool] = None, prefill_tiles: Optional[str] = None,
         manifest: Optional[str] = None, jobs: Optional[int] = None, no_mma: bool = False,
         dry_run: bool = False, cache_dir: Optional[str] = None, check: bool = True) -> Dict[str, object]:
    """Compiles kernel variants into the disk cache, as ``astrai-jit warm`` (no GPU needed).

    Each selection takes a value or a list: ``arch="sm_90a"``, ``kernels=["paged_decode",
    "rotary_emb"]``, ``dtypes``, ``head_dims``, ``page_sizes``, ``group_sizes``, and
    ``features`` (feature sets: ``"none"`` or names joined by ``+``, e.g. ``["none",
    "swa+sink", "kv_e4m3", "q4"]``). On sm_90a, ``hopper=True`` warms only the Hopper variants
    (``--hopper``), ``hopper=False`` only the portable ones (``--no-hopper``), ``None`` both;
    ``prefill_tiles`` is ``"auto"``, ``"narrow"`` or ``"wide"``. With no selection, the CLI's
    default set is compiled. Returns the summary (``variants``, ``compiled``, ``cached``,
    ``failed``, ``bytes`` compiled, ``seconds``) and the CLI's ``output``; a failed compile or a
    bad choice raises astrai_jit.Error unless ``check=False``.
    """
    args = ["warm"]
    args += _join("arch", arch) + _join("kernels", kernels) + _join("dtypes", dtypes)
    args += _join("head-dims", head_dims) + _join("page-sizes", page_sizes) + _join("group-sizes", group_sizes)
    args += _join("features", features)
    if hopper is not None:
        args.append("--hopper" if hopper else "--no-hopper")
    if prefill_tiles is not None:
        args += ["--prefill-tiles", str(prefill_tiles)]
    if manifest is not None:
        args += ["--manifest", os.fspath(manifest)]
    if jobs is not None:
        args += ["--jobs", str(int(jobs))]
    if no_mma:
        args.append("--no-mma")
    if dry_run:
        args.append("--dry-run")
    if cache_dir is not None:
        args += ["--cache-dir", os.fspath(cache_dir)]
    result = run_cli(args, check=check)
    summary: Dict[str, object] = {"returncode": result.returncode, "output": result.stdout + result.stderr}
    match = _SUMMARY.search(result.stdout)
    if match:
        variants, compiled, size, cached, failed, seconds = match.groups()
        summary.update(variants=int(variants), compiled=int(compiled), bytes=int(size or 0),
                       cached=int(cached), failed=int(failed), seconds=float(seconds))
    else:
        match = _DRY.search(result.stdout)
        if match:
            summary.update(variants=int(match.group(1)), cached=int(match.group(2)))
    return summary


def cache_info() -> Dict[str, object]:
    """The disk cache as ``astrai-jit cache stats`` reports it: ``directory``, ``mode``,
    ``entries``, ``total_bytes``, ``cap``."""
    result = run_cli(["cache", "stats"])
    info: Dict[str, object] = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().replace(" ", "_")
        value = value.strip()
        if key == "entries":
            info[key] = int(value)
        elif key == "total_bytes":
            info[key] = int(value.split()[0])
        else:
            info[key] = value
    return info


def cache_entries() -> List[str]:
    """The lines of ``astrai-jit cache list``, one entry each."""
    return [line for line in run_cli(["cache", "list"]).stdout.splitlines() if line.strip()]


def loaded_variants() -> List[str]:
    """Readable names of the variants this process has loaded (starts the runtime)."""
    return list(_C.loaded_variants())
