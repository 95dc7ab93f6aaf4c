"""AstrAI's compiled kernel modules served by astrai-jit, on the CPU: the install into an AstrAI
package, AstrAI's loader finding the modules, and AstrAI's calls reaching the kernels' checks
(int32 and int64 tables, 2-D to 4-D masks, both paged-decode forms); refusals by name."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import astrai_jit.astrai_csrc as C  # noqa: E402
import astrai_jit.astrai_install as I  # noqa: E402

bf16 = torch.bfloat16
ON_CPU = "is on cpu"  # the extension's device check: everything before it passed


# AstrAI's loader at 75304d0 lists the compiled modules in lib/ and imports each (530d280 imports a
# fixed list of four names the same way); the fake package below does exactly that.
_LOADER = textwrap.dedent('''
    import glob, importlib, os
    _LIB_DIR = os.path.join(os.path.dirname(__file__), "lib")
    KERNEL_NAMES = sorted(os.path.basename(p).split(".", 1)[0] for p in glob.glob(os.path.join(_LIB_DIR, "*.so")))
    _available, _modules = {}, {}
    for _name in KERNEL_NAMES:
        try:
            _modules[_name] = importlib.import_module(f".lib.{_name}", package=__package__)
            _available[_name] = True
        except ImportError:
            _available[_name], _modules[_name] = False, None
''')


@pytest.fixture
def astrai_package(tmp_path):
    ext = tmp_path / "astrai" / "extension"
    (ext / "lib").mkdir(parents=True)
    (tmp_path / "astrai" / "__init__.py").write_text("")
    (ext / "__init__.py").write_text("")
    (ext / "lib" / "__init__.py").write_text("")
    (ext / "loader.py").write_text(_LOADER)
    return tmp_path


def _names(lib):
    return sorted(p.name.split(".", 1)[0] for p in lib.iterdir() if p.name.endswith(".so"))


def test_install_puts_a_module_under_each_kernel_name(astrai_package):
    lib = I.find_lib_dir(str(astrai_package))
    assert lib == astrai_package / "astrai" / "extension" / "lib"
    I.install(lib)
    assert _names(lib) == sorted(I.KERNEL_NAMES)
    assert all("astrai-jit" in line for line in I.status(lib))
    assert all("already" in line for line in I.install(lib))  # a second install changes nothing


def test_install_keeps_astrais_own_build_and_uninstall_restores_it(astrai_package):
    lib = astrai_package / "astrai" / "extension" / "lib"
    own = lib / ("attn_decode" + I._SUFFIX)
    own.write_bytes(b"AstrAI's own kernel")
    lines = I.install(lib)
    assert any("kept as" in line for line in lines)
    assert (lib / (own.name + ".astrai-own")).read_bytes() == b"AstrAI's own kernel"
    I.uninstall(lib)
    assert own.read_bytes() == b"AstrAI's own kernel"
    assert _names(lib) == ["attn_decode"]


def test_install_refuses_to_overwrite_a_kept_build(astrai_package):
    lib = astrai_package / "astrai" / "extension" / "lib"
    (lib / ("rotary_emb" + I._SUFFIX)).write_bytes(b"new")
    (lib / ("rotary_emb" + I._SUFFIX + ".astrai-own")).write_bytes(b"old")
    with pytest.raises(I.InstallError, match="move one of them away"):
        I.install(lib)
    assert (lib / ("rotary_emb" + I._SUFFIX + ".astrai-own")).read_bytes() == b"old"


def test_a_directory_without_astrais_loader_is_refused(tmp_path):
    with pytest.raises(I.InstallError, match="not an AstrAI package"):
        I.find_lib_dir(str(tmp_path))


@pytest.mark.parametrize("with_fp8", [False, True])
def test_astrais_loader_finds_and_imports_the_modules(astrai_package, with_fp8):
    # 2026-08 on, AstrAI's source loads an FP8 GEMM module too: the stand-in must import under
    # that name as well, with its five functions.
    if with_fp8:
        (astrai_package / "astrai" / "extension" / "ops").mkdir()
        (astrai_package / "astrai" / "extension" / "ops" / "fp8.py").write_text("")
    I.install(I.find_lib_dir(str(astrai_package)))
    script = textwrap.dedent(f'''
        from astrai.extension import loader
        import astrai_jit.astrai_csrc as C
        import astrai_jit.astrai_fp8 as F
        names = sorted(C.KERNEL_NAMES + ((C.FP8_KERNEL,) if {with_fp8} else ()))
        assert loader.KERNEL_NAMES == names, loader.KERNEL_NAMES
        for name in loader.KERNEL_NAMES:
            assert loader._available[name], name
            assert loader._modules[name].served_by == "astrai-jit"
            functions = F.KERNEL_FUNCTIONS if name == C.FP8_KERNEL else (name,)
            for function in functions:
                assert getattr(loader._modules[name], function) is getattr(F if name == C.FP8_KERNEL else C, function)
        print("ok")
    ''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(astrai_package)] + sys.path))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_command_line_reports_its_work(astrai_package):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = [sys.executable, "-m", "astrai_jit.astrai_install", "--astrai", str(astrai_package)]
    done = subprocess.run(run, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "attn_paged_prefill: astrai-jit's" in done.stdout
    status = subprocess.run(run + ["--status"], env=env, capture_output=True, text=True)
    assert "rotary_emb: astrai-jit" in status.stdout
    bad = subprocess.run(run[:-1] + [str(astrai_package / "nowhere")], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "astrai_install: error:" in bad.stderr


# AstrAI's calls, as its wrappers make them, reach the kernels' device check on CPU tensors.

def _blhd(b=2, l=1, h=4, d=64):
    return torch.randn(b, l, h, d, dtype=bf16)


def test_2026_07_decode_prefill_calls_with_4d_masks():
    q, k, v = _blhd(), _blhd(l=9, h=2), _blhd(l=9, h=2)
    with pytest.raises(ValueError, match=ON_CPU):
        C.attn_decode(q, k, v, mask=torch.ones(2, 1, 1, 9, dtype=torch.bool), causal_offset=8, layout=1)
    q = _blhd(l=5)
    with pytest.raises(ValueError, match=ON_CPU):
        C.attn_prefill(q, k, v, mask=torch.ones(2, 1, 5, 9, dtype=torch.bool), causal_offset=4, layout=1)
    with pytest.raises(ValueError, match=ON_CPU):  # layout 0: [batch, heads, seq, D]
        C.attn_prefill(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, -1, 0.0, 0)


def test_per_head_masks_are_refused_by_name():
    q, k = _blhd(l=5), _blhd(l=9, h=2)
    with pytest.raises(ValueError, match=r"attn_prefill: mask has shape \[2, 4, 5, 9\]: one mask per head"):
        C.attn_prefill(q, k, k, mask=torch.ones(2, 4, 5, 9, dtype=torch.bool), layout=1)


def test_bad_layout_is_refused_by_name():
    q = _blhd()
    with pytest.raises(ValueError, match="layout 2 is not valid"):
        C.attn_decode(q, q, q, layout=2)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_2026_07_paged_decode_takes_the_int64_table(index_dtype):
    q = _blhd()
    pages = torch.randn(32, 1, 2, 64, dtype=bf16)
    table = torch.arange(2 * 16, dtype=index_dtype).reshape(2, 16)
    mask = torch.ones(2, 12, dtype=torch.bool)
    with pytest.raises(ValueError, match=ON_CPU):
        C.attn_paged_decode(q, table, pages, pages, 1, 12, mask=mask, causal_offset=11, layout=1)
    with pytest.raises(ValueError, match=ON_CPU):  # keyword form
        C.attn_paged_decode(q, page_table=table, k_cache=pages, v_cache=pages, page_size=1, kv_len=12, layout=1)
    with pytest.raises(ValueError, match="attn_paged_decode: kv_len 17 does not fit"):
        C.attn_paged_decode(q, table, pages, pages, 1, 17, layout=1)


def test_2026_08_paged_calls_take_the_flat_pool():
    q = torch.randn(3, 4, 64, dtype=bf16)
    pool = torch.randn(100, 2, 64, dtype=bf16)
    req_to_token = torch.arange(4 * 32, dtype=torch.int32).reshape(4, 32) % 100
    rows = torch.tensor([2, 0, 3], dtype=torch.int64)
    kv_indptr = torch.tensor([0, 5, 9, 20], dtype=torch.int32)
    new = torch.randn(3, 2, 64, dtype=bf16)
    with pytest.raises(ValueError, match=ON_CPU):
        C.attn_paged_decode(q, pool, pool, req_to_token, rows, kv_indptr, new_k=new, new_v=new, causal_offset=0,
                            out_buf=torch.empty(8, 4, 64, dtype=bf16))
    total = torch.randn(11, 4, 64, dtype=bf16)
    qo = torch.tensor([0, 2, 3, 11], dtype=torch.int32)
    tiles = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match=ON_CPU):
        C.attn_paged_prefill(total, pool, pool, req_to_token, rows, kv_indptr, qo, tiles, tiles,
                             torch.ones(3, 1, 8, 32, dtype=torch.bool), causal_offset=0)
    with pytest.raises(ValueError, match=ON_CPU):  # a mask row per request, shared by its queries
        C.attn_paged_prefill(total, pool, pool, req_to_token, rows, kv_indptr, qo, tiles, tiles,
                             torch.ones(3, 20, dtype=torch.bool), causal_offset=0)


def test_populate_refuses_an_unknown_name():
    import types
    with pytest.raises(ImportError, match="serves no AstrAI kernel named 'moe_gemm'"):
        C.populate(types.ModuleType("astrai.extension.lib.moe_gemm"))


def test_populate_fills_the_fp8_module_with_its_five_functions():
    import types
    import astrai_jit.astrai_fp8 as F
    module = types.ModuleType("astrai.extension.lib.fp8_mm")
    C.populate(module)
    assert module.served_by == "astrai-jit"
    for name in ("fp8_mm", "quantize_bf16", "mm_fp8", "linear_forward_fp8", "linear_backward_fp8"):
        assert getattr(module, name) is getattr(F, name)


def test_install_adds_fp8_mm_only_to_an_astrai_that_loads_it(astrai_package):
    lib = astrai_package / "astrai" / "extension" / "lib"
    I.install(lib)
    assert "fp8_mm" not in _names(lib)  # 2026-07: no FP8 module in AstrAI's source
    (lib.parent / "ops").mkdir()
    (lib.parent / "ops" / "fp8.py").write_text("")
    I.install(lib)
    assert _names(lib) == sorted(I.KERNEL_NAMES + ("fp8_mm",))
    assert any(line.startswith("fp8_mm: astrai-jit") for line in I.status(lib))
    I.uninstall(lib)
    assert _names(lib) == []


def test_the_gpu_comparison_bounds_fp16_rows_below_its_normal_range_by_the_spacing():
    # The comparison the GPU tests use (reference.py), fed here on the CPU.
    from reference import assert_rows_close
    want = torch.rand(4, 64, dtype=torch.float64) * 8e-7 - 4e-7  # fp16 subnormals: spacing 2^-24
    assert_rows_close(want.to(torch.float16), want)
    with pytest.raises(AssertionError):
        assert_rows_close((want + 2 * 2.0 ** -24).to(torch.float16), want)
    with pytest.raises(AssertionError):  # rows in the normal range keep their relative bound
        assert_rows_close((want * 1e4 * 0.97).to(torch.float16), want * 1e4)


def test_the_longest_request_is_read_again_when_either_offsets_tensor_changes():
    qo = torch.tensor([0, 2, 5], dtype=torch.int32)
    kv = torch.tensor([0, 10, 30], dtype=torch.int32)
    assert C._remembered_lengths(qo, kv) == (3, 20)
    kv[2] = 50  # the next chunk of the same prompts: same query counts, longer KV
    assert C._remembered_lengths(qo, kv) == (3, 40)
    qo[2] = 9
    assert C._remembered_lengths(qo, kv) == (7, 40)
    other = torch.tensor([0, 1, 2], dtype=torch.int32)  # a new tensor is read, whatever its address
    assert C._remembered_lengths(other, kv) == (1, 40)
