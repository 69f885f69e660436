"""``python -m runtime.transparent SCRIPT ARGS``: run SCRIPT under the transparent runtime."""

import sys

from runtime.transparent.worker import run_script

if __name__ == "__main__":
    run_script(sys.argv[1:])
