"""Wan2.2-T2V-A14B with the paper's settings (81 frames 1280x720, 20 steps, guidance 4/3, UniPC, shift 12).

Run: ``python -m fsattn_diffusers.pipelines.wan22_t2v_a14b --prompt "..." [--policy hybrid] [--model DIR]``
(needs the weights: the Hub id in the settings or a local copy; a GPU with enough memory or --offload).
"""

import sys

from ._runner import run
from .settings import WAN22_T2V_A14B

if __name__ == "__main__":
    sys.exit(run(WAN22_T2V_A14B))
