"""Quality tooling: hybrid-schedule sweeps against BF16 and per-call attention capture.

* :mod:`.metrics` — PSNR / SSIM (scikit-image) and LPIPS (``lpips``, AlexNet) on uint8 frames.
* :mod:`.sweep` — ``fsattn sweep``: one video per prompt x policy, metrics against the bf16 video,
  CSV / JSON / plots / frame grids / ``report.md``.
* :mod:`.capture` — ``fsattn capture``: every self-attention call of one bf16 run, rollback rates and
  errors of each recipe on sampled query rows, optional Q/K/V of the worst calls for
  ``fsattn accuracy --replay``.

Heavy optional dependencies (scikit-image, matplotlib, lpips) are imported where they are used.
"""

from .metrics import FrameMetrics, compare_frames, frame_indices, psnr, ssim

__all__ = ["FrameMetrics", "compare_frames", "frame_indices", "psnr", "ssim"]
