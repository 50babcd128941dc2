"""The committed result files (``benchmarks/results/*.json``) as the README's tables read them: loading, the
provenance of a file (device, date, commit) and the markdown pieces every table is built from."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence

#: The repository root (this file is fsattn_diffusers/measure/result_files.py in a checkout).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join("benchmarks", "results")
SHAPE_NAMES = {(1, 24, 32768, 128): "paper (1, 24, 32768, 128)",
               (1, 40, 75600, 128): "Wan2.2-A14B 720p (1, 40, 75600, 128)",
               (1, 24, 119040, 128): "HunyuanVideo 720p (1, 24, 119040, 128)"}


def load(name: str, root: str = ROOT) -> Dict:
    """The JSON document of ``benchmarks/results/<name>`` under ``root``."""
    with open(os.path.join(root, RESULTS, name)) as fh:
        return json.load(fh)


def meta(doc: Dict) -> Dict:
    """A result document's provenance block (``meta``, or ``environment`` in bench files); {} without one."""
    return doc.get("meta") or doc.get("environment") or {}


def source(name: str, doc: Dict) -> str:
    """``[file](path) (device, date, commit)`` of one result file."""
    m = meta(doc)
    device = m.get("device") or ", ".join(m.get("devices", [])) or "?"
    if isinstance(m.get("devices"), list) and len(set(m["devices"])) == 1 and len(m["devices"]) > 1:
        device = f"{len(m['devices'])}x {m['devices'][0]}"
    return f"[{name}]({RESULTS}/{name}) ({device}, {str(m.get('date', '?'))[:10]}, {m.get('commit') or '?'})"


def provenance(sources: Sequence[str]) -> List[str]:
    """The table's provenance line: every file its numbers come from, with device, date and commit."""
    return ["", "Source: " + "; ".join(dict.fromkeys(sources)) + "."]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """A markdown table: the header, its rule and one line per row (cells already text)."""
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *["| " + " | ".join(r) + " |" for r in rows]]


def speedup_text(v: Optional[float]) -> str:
    """A speedup as the tables print it (``1.234x``); ``-`` where there is none."""
    return f"{v:.3f}x" if v else "-"
