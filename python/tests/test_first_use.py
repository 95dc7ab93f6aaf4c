"""What a newcomer meets first from Python (issue 50): the version, ``python -m astrai_jit``,
warm() with the CLI's choices, the message when PyTorch is missing, the module's docstring
(CPU)."""
import os
import re
import subprocess
import sys

import pytest

import astrai_jit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pyproject_version():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as file:
        match = re.search(r'^version = "([^"]+)"', file.read(), re.MULTILINE)
    assert match, "pyproject.toml has no version"
    return match.group(1)


def test_version_is_pyprojects_and_the_clis():
    assert astrai_jit.__version__ == _pyproject_version()
    result = astrai_jit._jit.run_cli(["--version"])
    assert result.stdout.startswith(f"astrai-jit {astrai_jit.__version__} (NVRTC "), result.stdout


def test_python_m_astrai_jit_is_the_cli():
    result = subprocess.run([sys.executable, "-m", "astrai_jit", "--version"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"astrai-jit {astrai_jit.__version__} ")
    bad = subprocess.run([sys.executable, "-m", "astrai_jit", "warm", "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.startswith("astrai-jit: error: "), bad.stderr


def _names(summary):
    return [line for line in summary["output"].splitlines() if line.startswith(("paged_decode.", "prefill."))]


PAGED_HD128 = dict(kernels="paged_decode", head_dims=128, group_sizes=4, page_sizes=16, dry_run=True)


def test_warm_takes_the_hopper_choice(tmp_path):
    both = astrai_jit.warm(arch="sm_90a", cache_dir=tmp_path, **PAGED_HD128)
    hopper = astrai_jit.warm(arch="sm_90a", hopper=True, cache_dir=tmp_path, **PAGED_HD128)
    portable = astrai_jit.warm(arch="sm_90a", hopper=False, cache_dir=tmp_path, **PAGED_HD128)
    assert both["variants"] == 2
    assert _names(hopper) == ["paged_decode.bf16.hd128.ps16.g4.tma.sm_90a"]
    assert _names(portable) == ["paged_decode.bf16.hd128.ps16.g4.sm_90a"]
    with pytest.raises(astrai_jit.Error, match="no Hopper variants"):
        astrai_jit.warm(arch="sm_89", hopper=True, cache_dir=tmp_path, **PAGED_HD128)


def test_warm_takes_features_and_prefill_tiles(tmp_path):
    summary = astrai_jit.warm(arch="sm_89", features=["none", "kv_e4m3", "swa+sink"], cache_dir=tmp_path,
                              **PAGED_HD128)
    names = _names(summary)
    assert len(names) == 3, names
    assert any("kv_e4m3" in name for name in names) and any("swa" in name and "sink" in name for name in names)
    wide = astrai_jit.warm(arch="sm_90a", kernels="prefill", head_dims=128, group_sizes=4, hopper=True,
                           prefill_tiles="wide", dry_run=True, cache_dir=tmp_path)
    assert _names(wide) == ["prefill.bf16.hd128.g4.wgmma.wide.sm_90a"], wide["output"]


def test_warm_counts_compiled_bytes_only(tmp_path):
    first = astrai_jit.warm(arch="sm_89", kernels="rotary_emb", head_dims=64, cache_dir=tmp_path)
    assert first["compiled"] == 1 and first["bytes"] > 0, first["output"]
    again = astrai_jit.warm(arch="sm_89", kernels="rotary_emb", head_dims=64, cache_dir=tmp_path)
    assert (again["compiled"], again["cached"], again["bytes"]) == (0, 1, 0), again["output"]
    assert "1 variant," in again["output"]


@pytest.mark.parametrize("name", ["paged_decode", "prefill"])
def test_a_missing_torch_says_what_to_install(name):
    # A finder ahead of the others makes `import torch` fail as if it were not installed.
    code = ("import importlib.abc, sys\n"
            "class NoTorch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'torch':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import astrai_jit\n"
            "try:\n"
            f"    astrai_jit.{name}\n"
            "except ModuleNotFoundError as error:\n"
            "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"astrai_jit.{name} needs PyTorch" in result.stdout, result.stdout
    assert "pip install 'astrai-jit[torch]'" in result.stdout


def test_the_docstring_lists_the_api():
    doc = astrai_jit.__doc__
    for name in [*astrai_jit.__all__, "__version__", "python -m astrai_jit", "astrai_jit._C"]:
        assert name in doc, name
