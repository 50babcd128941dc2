"""``FSATTN_KERNEL_VARIANT`` is read when a call picks its kernel variant, not when kernels.sm90.ops is imported."""

import pytest

pytest.importorskip("triton")  # kernels.sm90.ops imports Triton; CI runs this file in its Triton environment

from fsattn_diffusers.kernels.sm90 import ops  # noqa: E402
from fsattn_diffusers.kernels.sm90.plan import plan_for  # noqa: E402
from fsattn_diffusers.recipe import PRESETS  # noqa: E402

GATED = plan_for(PRESETS["mxfp8"])
UNGATED = plan_for(PRESETS["mxfp8"].replace(rollback=False))


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.setattr(ops, "VARIANT", None)
    monkeypatch.setattr(ops, "INTERPRET", False)  # as on a GPU: gluon_pingpong applies to the gated recipes


def test_the_environment_is_read_at_each_call(monkeypatch):
    monkeypatch.delenv("FSATTN_KERNEL_VARIANT", raising=False)
    assert ops.effective_variant(None, GATED) == ops.GLUON_PINGPONG
    monkeypatch.setenv("FSATTN_KERNEL_VARIANT", "triton")
    assert ops.effective_variant(None, GATED) == ops.TRITON
    monkeypatch.setenv("FSATTN_KERNEL_VARIANT", "gluon_pingpong")
    assert ops.effective_variant(None, GATED) == ops.GLUON_PINGPONG
    assert ops.effective_variant(None, UNGATED) == ops.TRITON  # where gluon_pingpong does not apply


def test_an_explicit_variant_and_the_process_override_come_first(monkeypatch):
    monkeypatch.setenv("FSATTN_KERNEL_VARIANT", "triton")
    assert ops.effective_variant("gluon_pingpong", GATED) == ops.GLUON_PINGPONG
    monkeypatch.setattr(ops, "VARIANT", "gluon_pingpong")
    assert ops.effective_variant(None, GATED) == ops.GLUON_PINGPONG


def test_an_unknown_variant_is_one_line_naming_its_source(monkeypatch):
    monkeypatch.setenv("FSATTN_KERNEL_VARIANT", "gluonpp")
    with pytest.raises(ValueError) as info:
        ops.effective_variant(None, GATED)
    msg = str(info.value)
    assert "\n" not in msg and "FSATTN_KERNEL_VARIANT='gluonpp'" in msg and "accepted: gluon_pingpong, triton" in msg
    with pytest.raises(ValueError, match=r"^variant='x' is not a kernel variant; accepted: gluon_pingpong, triton$"):
        ops.effective_variant("x", GATED)
