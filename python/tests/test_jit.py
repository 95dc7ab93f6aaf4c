"""The JIT from Python: warm() and cache_info() through the packaged CLI, the console script,
import without PyTorch or a GPU (CPU)."""
import os
import shutil
import subprocess
import sys

import pytest

import astrai_jit


def test_cli_is_packaged_and_runs():
    assert os.access(astrai_jit.cli_path(), os.X_OK)
    result = astrai_jit._jit.run_cli(["--help"])
    assert "astrai-jit" in result.stdout


def test_console_script_on_path_runs():
    if not os.path.realpath(astrai_jit.__file__).startswith(os.path.realpath(sys.prefix)):
        pytest.skip("installed outside this interpreter's prefix (pip --target): no console script")
    script = shutil.which("astrai-jit", path=os.path.dirname(sys.executable))
    assert script is not None, "astrai-jit console script not installed next to python"
    result = subprocess.run([script, "info"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "NVRTC" in result.stdout


def test_warm_compiles_then_hits_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = astrai_jit.warm(arch="sm_90a", kernels="rotary_emb", head_dims=64, cache_dir=cache, jobs=1)
    assert (first["variants"], first["compiled"], first["failed"]) == (1, 1, 0), first["output"]
    second = astrai_jit.warm(arch="sm_90a", kernels=["rotary_emb"], head_dims=[64], cache_dir=cache)
    assert (second["compiled"], second["cached"]) == (0, 1)


def test_cache_info_reads_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ASTRAI_JIT_CACHE_DIR", str(tmp_path / "c"))
    astrai_jit.warm(arch="sm_90a", kernels="rotary_emb", head_dims=64)
    info = astrai_jit.cache_info()
    assert info["directory"] == str(tmp_path / "c")
    assert info["mode"] == "rw" and info["entries"] == 1 and info["total_bytes"] > 0


def test_warm_dry_run_counts_the_default_set(tmp_path):
    # 6 portable variants; on sm_90a the page-16 paged_decode ones (hd64, hd128) gain .tma twins,
    # and hd64 its wide CTAs (.tma.wide).
    summary = astrai_jit.warm(arch="sm_90a", dry_run=True, cache_dir=tmp_path)
    assert summary["variants"] == 9 and summary["cached"] == 0
    assert summary["output"].count(".tma.sm_90a") == 2, summary["output"]
    assert summary["output"].count(".tma.wide.sm_90a") == 1, summary["output"]
    portable = astrai_jit.warm(arch="sm_89", dry_run=True, cache_dir=tmp_path)
    assert portable["variants"] == 6


def test_bad_warm_choice_raises_with_the_cli_message(tmp_path):
    with pytest.raises(astrai_jit.Error, match="exited with 2"):
        astrai_jit.warm(kernels="nonsense", cache_dir=tmp_path)


def test_loaded_variants_is_empty_without_calls():
    code = "import astrai_jit; print(astrai_jit.loaded_variants())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_import_needs_neither_torch_nor_a_gpu():
    code = ("import sys, astrai_jit; assert 'torch' not in sys.modules; "
            "print(astrai_jit.__version__, astrai_jit._loader.load_nvrtc())")
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(astrai_jit.__version__)
