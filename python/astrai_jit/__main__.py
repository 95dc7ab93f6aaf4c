"""``python -m astrai_jit ARGS`` runs the ``astrai-jit`` CLI, as the console script does (for an
environment whose scripts directory is not on the PATH)."""
from ._cli import main

if __name__ == "__main__":
    main()
