"""Looking at rendered PDFs the way a reader would: their text and their pixels."""

from __future__ import annotations

import subprocess
from pathlib import Path


def pdf_text(pdf: Path, layout: bool = False) -> str:
    """The PDF's text (pdftotext; ``layout`` keeps table rows on one line), white space
    collapsed to single spaces."""
    args = ["pdftotext", *(["-layout"] if layout else []), str(pdf), "-"]
    raw = subprocess.run(args, check=True, capture_output=True).stdout
    return " ".join(raw.decode("utf-8").split())


def page_count(pdf: Path) -> int:
    """Number of pages (pdfinfo)."""
    info = subprocess.run(["pdfinfo", str(pdf)], check=True, capture_output=True, text=True)
    for line in info.stdout.splitlines():
        if line.startswith("Pages:"):
            return int(line.split()[1])
    raise AssertionError("pdfinfo printed no page count")


def page_pixels(pdf: Path, out: Path, first: int = 1, last: int | None = None,
                dpi: int = 30) -> list[tuple[Path, float]]:
    """Render pages to PNG (for people) and grey PGM (for the test) with pdftoppm.

    Returns, per page, the PNG's path and the grey level variance (0 for a blank page).
    """
    last = last or first
    rng = ["-f", str(first), "-l", str(last)]
    subprocess.run(["pdftoppm", *rng, "-r", str(dpi), "-png", str(pdf), str(out / "page")],
                   check=True)
    subprocess.run(["pdftoppm", *rng, "-r", str(dpi), "-gray", str(pdf), str(out / "grey")],
                   check=True)
    result = []
    for pgm in sorted(out.glob("grey-*.pgm")):
        data = pgm.read_bytes()
        # P5\n<w> <h>\n255\n<pixels>
        parts = data.split(b"\n", 3)
        pixels = parts[3]
        n = len(pixels)
        mean = sum(pixels) / n
        var = sum((p - mean) ** 2 for p in pixels) / n
        result.append((out / pgm.name.replace("grey", "page").replace(".pgm", ".png"), var))
    return result
