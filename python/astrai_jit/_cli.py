"""The ``astrai-jit`` console script: runs the packaged CLI with libnvrtc found."""
from __future__ import annotations

import os
import sys


def main() -> None:
    from ._jit import cli_env, cli_path

    path = cli_path()
    os.execve(path, [path, *sys.argv[1:]], cli_env())


if __name__ == "__main__":
    main()
