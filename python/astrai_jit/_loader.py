"""Finds libnvrtc before the extension module loads.

The extension and the packaged CLI link libnvrtc by soname. It may come from the CUDA toolkit
or from the ``nvidia-cuda-nvrtc`` wheel (which PyTorch's CUDA wheels install); neither is on the
default library path, so the library is loaded here once, by full path, with RTLD_GLOBAL. The
dynamic loader then resolves the extension's dependency to the already-loaded copy.
"""
from __future__ import annotations

import ctypes
import glob
import os
import site
import stat
import sysconfig
from typing import List, Optional

from ._build_config import NVRTC_SONAME

_loaded: Optional[str] = None


def _package_dirs() -> List[str]:
    """Where installed packages live: site-packages (the interpreter's, the user's, a virtual
    environment's) and PYTHONPATH. Not the rest of sys.path: sys.path[0] is the script's
    directory or the working directory, where anyone who can write there could plant a library."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    dirs.extend(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    dirs.extend(entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry)
    unique = []
    for entry in dirs:
        if entry and os.path.isabs(entry) and entry not in unique:
            unique.append(entry)
    return unique


def _site_dirs() -> List[str]:
    nvidia = [os.path.join(entry, "nvidia") for entry in _package_dirs()]
    return [entry for entry in nvidia if os.path.isdir(entry)]


def trusted(path: str) -> bool:
    """A library this process may load: the file and its directory owned by this user or root and
    writable by no one else (as the kernel cache's trust rules ask of its files)."""
    uid = os.getuid()
    for target in (path, os.path.dirname(path)):
        try:
            info = os.stat(target)
        except OSError:
            return False
        if info.st_uid not in (uid, 0) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def candidate_dirs() -> List[str]:
    """Directories searched for libnvrtc, in order."""
    dirs: List[str] = []
    explicit = os.environ.get("ASTRAI_JIT_NVRTC_DIR")
    if explicit:
        dirs.append(explicit)
    for nvidia in _site_dirs():
        # nvidia-cuda-nvrtc 13.x installs under nvidia/cu13/lib, the 12.x wheels under
        # nvidia/cuda_nvrtc/lib.
        dirs.extend(sorted(glob.glob(os.path.join(nvidia, "cu*", "lib"))))
        dirs.append(os.path.join(nvidia, "cuda_nvrtc", "lib"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            dirs.extend([os.path.join(root, "lib64"), os.path.join(root, "lib")])
    dirs.extend(["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                 "/usr/local/cuda/targets/sbsa-linux/lib"])
    return dirs


def find_nvrtc() -> Optional[str]:
    """The path of the libnvrtc this build needs, or None (then the system loader decides)."""
    for directory in candidate_dirs():
        path = os.path.join(directory, NVRTC_SONAME)
        if os.path.isfile(path) and trusted(path):
            return path
    return None


def load_nvrtc() -> Optional[str]:
    """Loads libnvrtc once; returns the path it came from (None: left to the system loader)."""
    global _loaded
    if _loaded is None:
        path = find_nvrtc()
        if path is not None:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            _loaded = path
        else:
            _loaded = ""
    return _loaded or None


def import_extension():
    """Imports astrai_jit._C, with a message naming what is missing when libnvrtc is absent."""
    load_nvrtc()
    try:
        from . import _C
    except ImportError as error:
        if NVRTC_SONAME in str(error):
            raise ImportError(
                f"astrai_jit needs {NVRTC_SONAME} (NVRTC). Install the CUDA toolkit, or "
                f"`pip install nvidia-cuda-nvrtc`, or point ASTRAI_JIT_NVRTC_DIR at the directory "
                f"holding it. Searched: {', '.join(candidate_dirs())}") from error
        raise
    return _C
