"""What ``yoco run --transparent`` starts in each worker process, as a file (the launcher
and the spare zygote run a *file* as ``__main__``): ``launch.py SCRIPT ARGS`` runs SCRIPT
under the transparent runtime, exactly as ``python SCRIPT ARGS`` would run it otherwise."""

import sys
from pathlib import Path

if __name__ == "__main__":
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.append(root)  # the runtime's own package, after the script's folder
    from runtime.transparent.worker import run_script

    run_script(sys.argv[1:])
