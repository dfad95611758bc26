"""Trial records files (JSON Lines of {graph, resources, strategy, result}), plain or compressed.

An accuracy run's records are about 6 MB, nearly all of it the same graph and spec repeated; xz
keeps them at about 2% of that, small enough to commit beside the report they produced, so a later
simulator can re-score the same measurements (`--from-records` here, `--trials` in the cost model).
"""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path

OPENERS = {".xz": lzma.open, ".gz": gzip.open}


def read_lines(path: Path) -> list[str]:
    """The file's lines, decompressed by its suffix (`.xz`, `.gz`, else plain text)."""
    opener = OPENERS.get(path.suffix)
    if opener is None:
        return path.read_text().splitlines()
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()
