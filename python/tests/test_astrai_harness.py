"""scripts/astrai/harness.py on the CPU: the comparison of AstrAI's test results with its own kernels
and with astrai-jit's, and the refusal of a checkout that is not a pinned commit."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("harness", ROOT / "scripts" / "astrai" / "harness.py")
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)


def _junit(path, cases):
    body = []
    for name, outcome, message in cases:
        inner = {"passed": "", "failed": '<failure message="x"/>',
                 "skipped": f'<skipped message="{message}"/>'}[outcome]
        body.append(f'<testcase classname="tests.extension.t" name="{name}">{inner}</testcase>')
    path.write_text(f'<testsuites><testsuite>{"".join(body)}</testsuite></testsuites>')
    return path


def test_every_test_passing_with_astrais_kernels_must_pass_with_ours(tmp_path, capsys):
    own = _junit(tmp_path / "own.xml", [("a", "passed", ""), ("b", "passed", ""), ("c", "failed", "")])
    same = _junit(tmp_path / "same.xml", [("a", "passed", ""), ("b", "passed", ""), ("c", "failed", "")])
    assert harness.compare(own, same) == 0
    worse = _junit(tmp_path / "worse.xml", [("a", "passed", ""), ("b", "failed", ""), ("c", "passed", "")])
    assert harness.compare(own, worse) == 1
    assert "tests.extension.t::b: passed with AstrAI's kernels, failed" in capsys.readouterr().out
    missing = _junit(tmp_path / "missing.xml", [("a", "passed", "")])
    assert harness.compare(own, missing) == 1


def test_a_skip_for_a_missing_kernel_fails_the_comparison(tmp_path):
    own = _junit(tmp_path / "own.xml", [("a", "skipped", "CUDA kernels not built")])
    jit = _junit(tmp_path / "jit.xml", [("a", "skipped", "CUDA kernels not built")])
    assert harness.compare(own, jit) == 1


def test_a_checkout_that_is_not_pinned_is_refused(tmp_path):
    (tmp_path / "astrai").mkdir()
    (tmp_path / "astrai" / "x.py").write_text("x = 1\n")
    with pytest.raises(SystemExit, match="is not a pinned AstrAI commit"):
        harness.identify(tmp_path)
    first = harness.fingerprint(tmp_path)
    (tmp_path / "astrai" / "extension").mkdir()
    (tmp_path / "astrai" / "extension" / "lib").mkdir()
    (tmp_path / "astrai" / "extension" / "lib" / "attn_decode.so").write_bytes(b"built")
    assert harness.fingerprint(tmp_path) == first  # compiled modules do not change the fingerprint
    (tmp_path / "astrai" / "x.py").write_text("x = 2\n")
    assert harness.fingerprint(tmp_path) != first
