"""Each numeric constant has one definition; where a kernel must hold its own copy (a Triton/Gluon constexpr),
the copy is built from the reference's value and checked equal here."""

import math

import pytest

from fsattn_diffusers import api, exponent, formats, operands, recipe, sm90_numerics
from fsattn_diffusers.backends import fa3_backend
from fsattn_diffusers.kernels.sm90 import plan


def test_library_modules_share_one_definition():
    assert api.MX_BLOCK is formats.MX_BLOCK == 32
    assert recipe.SCALE_RULES is formats.SCALE_RULES
    assert operands.LOG2E is exponent.LOG2E == 1.0 / math.log(2.0)
    assert fa3_backend.E4M3_MAX == formats.E4M3.max_value == 448.0


def test_kernel_plan_takes_the_reference_values():
    assert plan.P_HEADROOM_LOG2 == sm90_numerics.P_HEADROOM_LOG2
    assert (plan.P_SIGMA_FP8, plan.P_SIGMA_MXFP6) == (sm90_numerics.P_SIGMA["fp8_row"], sm90_numerics.P_SIGMA["mxfp6"])
    for name, code in plan._MX_FMT.items():
        elem = formats.MX_ELEMENT[name]
        print(name, plan.ELEM[code], plan.CARRY_T0[code])
        assert plan.ELEM[code] == (elem.mbits, elem.emin, elem.max_value, elem.emax)
        assert plan.CARRY_T0[code] == sm90_numerics.CARRY_T0[name]
        # the carry's headroom: the element maximum times 2^t0 stays inside E4M3
        assert elem.max_value * 2 ** plan.CARRY_T0[code] <= formats.E4M3.max_value
    assert set(plan._RULES) == set(formats.SCALE_RULES)


def test_kernel_constexprs_equal_the_reference():
    pytest.importorskip("triton")
    from fsattn_diffusers.kernels import common
    from fsattn_diffusers.kernels.sm90 import constants, fused_attention, fused_attention_gluon_pingpong as gluon, prepass

    assert prepass.KEY_TILE == sm90_numerics.TILE
    assert common.RNE_MAGIC.value == 1.5 * 2 ** 23
    # the pre-pass's short element roundings: E2M1's quantum below 2 is the ulp of E2M1_MAGIC; E2M3 on E4M3's grid at
    # 2^(E4M3 emin - E2M3 emin), saturating at E2M3's largest value there
    e2m1, e2m3, e4m3 = formats.E2M1, formats.E2M3, formats.E4M3
    fp32_ulp = 2.0 ** (math.floor(math.log2(common.E2M1_MAGIC.value)) - 23)
    assert fp32_ulp == 2.0 ** (e2m1.emin - e2m1.mbits) and common.E2M1_MAGIC.value == 1.5 * 2 ** 22
    assert e2m3.mbits == e4m3.mbits
    assert common.E2M3_TO_E4M3.value == 2.0 ** (e4m3.emin - e2m3.emin)
    assert constants.E2M3_MAX_SCALED.value == e2m3.max_value * common.E2M3_TO_E4M3.value
    assert fused_attention.D_BITS.value == sm90_numerics.D_BITS
    assert fused_attention.F16_MAX_BITS.value == sm90_numerics.F16_MAX_BITS
    assert gluon.D_BITS_F16.value == sm90_numerics.D_BITS_F16
    assert fused_attention.LN2.value == gluon.LN2.value == exponent.LN2
    # 8 c - F16_SHIFT is the FP16-grid Stage-A constant: MAGIC + D_BITS_F16 + 1024 sigma - 1024 m
    c = common.RNE_MAGIC.value + sm90_numerics.D_BITS
    assert 8 * c - fused_attention.F16_SHIFT.value == common.RNE_MAGIC.value + sm90_numerics.D_BITS_F16
