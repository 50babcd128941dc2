"""Where the kernel tests run: a CUDA GPU of sm_90 or newer, or (``FSATTN_KERNEL_TEST_CPU=1`` with
``TRITON_INTERPRET=1``) Triton's interpreter on the CPU; and the seeded inputs they share (:func:`make`)."""

import os

import pytest
import torch

CPU_INTERPRET = os.environ.get("FSATTN_KERNEL_TEST_CPU") == "1" and os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if CPU_INTERPRET else "cuda"


def skip_module_without_sm90() -> None:
    """Skip the calling test module unless the interpreter mode is on or an sm_90+ CUDA GPU is present."""
    if CPU_INTERPRET:
        return
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs sm_90+", allow_module_level=True)


def make(b, h, s_q, s_k, d, layout, seed=0, dtype=torch.bfloat16, spiky=False):
    """Seeded standard-normal q (B, H, S_q, D), k, v (B, H, S_k, D) on DEV; ``layout="bshd"``: BHSD views of BSHD
    memory with the same values, as diffusers passes them. ``spiky``: a few keys far above the rest and q x 2, which
    force the gate (and the reference) to roll back."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=g) for s in (s_q, s_k, s_k))
    if spiky:
        k[:, :, 3 * s_k // 4] *= 12.0
        k[:, :, s_k // 2 + 5] *= 8.0
        q *= 2.0
    q, k, v = (t.to(dtype).to(DEV) for t in (q, k, v))
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    return q, k, v
