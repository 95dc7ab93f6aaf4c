"""Cache metrics from Python: cache_metrics() as a dict, cache_metrics_prometheus() in the
Prometheus text format (checked line by line, and by prometheus_client's parser when it is
installed), and the CLI's `cache stats --json` (CPU; the kernel-call test needs a GPU)."""
import json
import math
import re

import pytest

import astrai_jit

TIERS = {"memory", "layer", "disk", "remote"}
LATENCY_KEYS = {"count", "sum_seconds", "min_seconds", "max_seconds", "buckets"}
SAMPLE = re.compile(r'^([a-z_]+)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (\S+)$')


def test_cache_metrics_is_a_dict_of_counters():
    metrics = astrai_jit.cache_metrics()
    assert set(metrics["tiers"]) == TIERS
    for tier in metrics["tiers"].values():
        assert isinstance(tier["hits"], int) and tier["hits"] >= 0
        assert isinstance(tier["misses"], int) and tier["misses"] >= 0
        assert set(tier["load_time"]) == LATENCY_KEYS
    for name in ("compiles", "compile_failures", "stores", "signature_refusals", "remote_errors"):
        assert isinstance(metrics[name], int) and metrics[name] >= 0, name
    buckets = metrics["compile_time"]["buckets"]
    bounds = [bound for bound, _ in buckets]
    counts = [count for _, count in buckets]
    assert bounds == sorted(bounds) and len(bounds) > 5
    assert counts == sorted(counts)  # cumulative
    assert counts[-1] <= metrics["compile_time"]["count"]


def test_prometheus_text_follows_the_exposition_format():
    text = astrai_jit.cache_metrics_prometheus()
    assert text.endswith("\n")
    families = {}
    family = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            family = line.split(" ")[2]
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == family and kind in ("counter", "histogram"), line
            assert kind != "counter" or name.endswith("_total"), line
            families[name] = kind
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, value = match.group(1), match.group(4)
        assert name.startswith(family), line
        if families[family] == "histogram":
            assert name[len(family):] in ("_bucket", "_sum", "_count"), line
        else:
            assert name == family, line
        assert not math.isnan(float(value))
    assert families["astrai_jit_compile_seconds"] == "histogram"
    assert families["astrai_jit_cache_hits_total"] == "counter"
    assert 'astrai_jit_cache_load_seconds_bucket{tier="disk",le="+Inf"}' in text


def test_prometheus_client_parses_the_text():
    parser = pytest.importorskip("prometheus_client.parser")
    families = {f.name: f for f in parser.text_string_to_metric_families(
        astrai_jit.cache_metrics_prometheus())}
    # prometheus_client names a counter family without its _total suffix.
    assert families["astrai_jit_cache_hits"].type == "counter"
    tiers = {s.labels["tier"] for s in families["astrai_jit_cache_hits"].samples}
    assert tiers == TIERS
    compile_seconds = families["astrai_jit_compile_seconds"]
    assert compile_seconds.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in compile_seconds.samples}
    assert samples[("astrai_jit_compile_seconds_bucket", "+Inf")] == \
        samples[("astrai_jit_compile_seconds_count", None)]


def test_cli_cache_stats_json(tmp_path):
    cache = tmp_path / "cache"
    astrai_jit.warm(arch="sm_80", kernels=["rotary_emb"], head_dims=[64], cache_dir=str(cache))
    result = astrai_jit._jit.run_cli(["cache", "stats", "--json", "--cache-dir", str(cache)])
    stats = json.loads(result.stdout)
    assert stats["directory"] == str(cache)
    assert stats["entries"] == 1 and stats["total_bytes"] > 0
    # A fresh CLI process has counted nothing of its own.
    assert set(stats["process"]["tiers"]) == TIERS
    assert stats["process"]["compiles"] == 0


@pytest.mark.gpu
def test_loading_a_new_variant_moves_the_counters():
    import torch

    if any(name.startswith("rotary_emb.fp16.hd96.") for name in astrai_jit.loaded_variants()):
        pytest.skip("this process already loaded the variant")
    before = astrai_jit.cache_metrics()
    x = torch.randn(2, 4, 96, device="cuda", dtype=torch.float16)
    freqs = torch.randn(2, 48, 2, device="cuda", dtype=torch.float32)
    astrai_jit.rotary_emb(x, freqs)
    after = astrai_jit.cache_metrics()
    assert after["tiers"]["memory"]["misses"] >= before["tiers"]["memory"]["misses"] + 1

    def served(m):
        return m["compiles"] + m["tiers"]["disk"]["hits"] + m["tiers"]["layer"]["hits"]

    assert served(after) >= served(before) + 1
