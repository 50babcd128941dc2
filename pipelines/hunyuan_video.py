"""HunyuanVideo with HunyuanVideoPipeline's defaults (720p, 129 frames, 50 steps, guidance 6).

Run: ``python -m fsattn_diffusers.pipelines.hunyuan_video --prompt "..." [--policy hybrid] [--model DIR]``
(needs the weights: the Hub id in the settings or a local copy; a GPU with enough memory or --offload).
"""

import sys

from ._runner import run
from .settings import HUNYUAN_VIDEO

if __name__ == "__main__":
    sys.exit(run(HUNYUAN_VIDEO))
