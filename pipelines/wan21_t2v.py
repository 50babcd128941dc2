"""Wan2.1-T2V-1.3B with diffusers' example settings (480p, 50 steps, guidance 5, shift 3).

Run: ``python -m fsattn_diffusers.pipelines.wan21_t2v --prompt "..." [--policy hybrid] [--model DIR]``
(needs the weights: the Hub id in the settings or a local copy; a GPU with enough memory or --offload).
"""

import sys

from ._runner import run
from .settings import WAN21_T2V_1_3B

if __name__ == "__main__":
    sys.exit(run(WAN21_T2V_1_3B))
