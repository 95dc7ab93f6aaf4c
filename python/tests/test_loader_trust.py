"""libnvrtc is looked for where packages are installed, never in the script's or the working
directory (sys.path[0]), and only a file nobody else can write is loaded."""
import os
import stat
import subprocess
import sys
import textwrap

from astrai_jit import _loader
from astrai_jit._build_config import NVRTC_SONAME


def _plant(root):
    lib = root / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / NVRTC_SONAME).write_bytes(b"\x7fELF planted")
    return lib / NVRTC_SONAME


def test_the_scripts_directory_is_not_searched(tmp_path):
    planted = _plant(tmp_path)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        import sys
        from astrai_jit import _loader
        print(sys.path[0])
        print(_loader.find_nvrtc())
        print("\\n".join(_loader.candidate_dirs()))
    """))
    # The package as installed, plus whatever PYTHONPATH the suite runs with (never tmp_path).
    env = dict(os.environ)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str(tmp_path)  # the planted directory is sys.path[0]...
    assert lines[1] != str(planted)   # ...and is neither loaded nor searched
    assert not any(line.startswith(str(tmp_path)) for line in lines[2:])


def test_a_library_others_can_write_is_not_trusted(tmp_path):
    planted = _plant(tmp_path)
    assert _loader.trusted(str(planted))
    os.chmod(planted, 0o664)
    assert not _loader.trusted(str(planted))
    os.chmod(planted, 0o644)
    os.chmod(planted.parent, 0o777)
    assert not _loader.trusted(str(planted))
    os.chmod(planted.parent, stat.S_IRWXU)


def test_an_explicit_directory_still_needs_a_trusted_file(tmp_path, monkeypatch):
    planted = _plant(tmp_path)
    monkeypatch.setenv("ASTRAI_JIT_NVRTC_DIR", str(planted.parent))
    assert _loader.find_nvrtc() == str(planted)
    os.chmod(planted, 0o666)
    assert _loader.find_nvrtc() != str(planted)
