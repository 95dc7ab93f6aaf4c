"""The kernel cache's counters in this process: ``cache_metrics()`` and its Prometheus text."""
from __future__ import annotations

from typing import Any, Dict

from . import _loader

_C = _loader.import_extension()


def cache_metrics() -> Dict[str, Any]:
    """This process's kernel cache counters, as a dict.

    ``tiers`` maps ``memory``, ``layer`` (ASTRAI_JIT_CACHE_PATH), ``disk`` and ``remote`` to
    ``hits``, ``misses`` and ``load_time``; then ``compiles``, ``compile_failures``, ``stores``,
    ``signature_refusals``, ``remote_errors`` and ``compile_time``. A time is a dict of
    ``count``, ``sum_seconds``, ``min_seconds``, ``max_seconds`` and ``buckets``, a list of
    (upper bound in seconds, cumulative count). Counters only grow; a lookup counts one hit or
    miss at each tier it reaches. ``warm()`` runs the CLI in another process: its compiles are
    not counted here.
    """
    return _C.cache_metrics()


def cache_metrics_prometheus() -> str:
    """The counters of ``cache_metrics()`` in the Prometheus text exposition format (0.0.4).

    Counters ``astrai_jit_*_total`` (hits and misses labelled by ``tier``), histograms
    ``astrai_jit_compile_seconds`` and ``astrai_jit_cache_load_seconds{tier=...}``. Serve it
    with ``Content-Type: text/plain; version=0.0.4``.
    """
    return _C.cache_metrics_prometheus()
