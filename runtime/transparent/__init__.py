"""Model-transparent mode: an unmodified ``torch.distributed`` training script under the
migration runtime (``yoco run --transparent``). See :mod:`runtime.transparent.worker` and
docs/runtime.md, "Transparent mode"."""

from pathlib import Path

#: The file each worker process runs (``launch.py SCRIPT ARGS``).
LAUNCHER = str(Path(__file__).resolve().parent / "launch.py")
