"""Shared fixtures: GPU tests are marked `gpu` and skip without a CUDA device, unless
ASTRAI_REQUIRE_GPU=1 (a GPU runner: scripts/gpu/run_python_gpu_suite.sh sets it), where a torch that
cannot reach CUDA, and a run in which no GPU test ran, fail the session. Random data come from
torch's generators seeded per test from ASTRAI_TEST_SEED (printed in the header)."""

import os
import zlib

import pytest

REQUIRE_GPU = os.environ.get("ASTRAI_REQUIRE_GPU", "") in ("1", "true")
BASE_SEED = int(os.environ.get("ASTRAI_TEST_SEED", "0") or 0)

if REQUIRE_GPU:
    import torch  # a missing torch is an error on a GPU runner, not a skip
else:
    torch = pytest.importorskip("torch")

_gpu_tests_run = 0


def has_gpu() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


def pytest_report_header(config):
    return f"ASTRAI_TEST_SEED={BASE_SEED} ASTRAI_REQUIRE_GPU={int(REQUIRE_GPU)}"


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    if REQUIRE_GPU:
        raise pytest.UsageError(f"ASTRAI_REQUIRE_GPU=1 but torch {torch.__version__} (CUDA {torch.version.cuda}) "
                                "cannot reach a CUDA GPU")
    skip = pytest.mark.skip(reason="no CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    global _gpu_tests_run
    if report.when == "call" and not report.skipped and "gpu" in report.keywords:
        _gpu_tests_run += 1


def pytest_sessionfinish(session, exitstatus):
    if REQUIRE_GPU and _gpu_tests_run == 0 and exitstatus == 0:
        print("\nASTRAI_REQUIRE_GPU=1 and no GPU test ran (a filter that matches none?)")
        session.exitstatus = 1


@pytest.fixture(autouse=True)
def _seeded(request):
    # One seed a test, from the base seed and the test's name: the same data each run unless
    # ASTRAI_TEST_SEED changes, and shown with a failure.
    seed = (BASE_SEED * 1000003 + zlib.crc32(request.node.nodeid.encode())) % (2 ** 63)
    torch.manual_seed(seed)
    print(f"seed {seed} (ASTRAI_TEST_SEED={BASE_SEED})")
    return seed


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # The CLI reads ASTRAI_JIT_* from the environment of each test; keep its cache private.
    monkeypatch.setenv("ASTRAI_JIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "astrai-jit-cache"))
