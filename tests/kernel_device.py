"""Where the kernel tests run: a CUDA GPU of sm_90 or newer, or (``FSATTN_KERNEL_TEST_CPU=1`` with
``TRITON_INTERPRET=1``) Triton's interpreter on the CPU."""

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
