"""Shared fixtures: GPU tests are marked `gpu` and skip without a CUDA device."""

import pytest

torch = pytest.importorskip("torch")


def has_gpu() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # The CLI reads ASTRAI_JIT_* from the environment of each test; keep its cache private.
    monkeypatch.setenv("ASTRAI_JIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "astrai-jit-cache"))
