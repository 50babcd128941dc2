"""Recipe.replace names what it computes and rejects unknown fields with one line."""

import dataclasses

import pytest

from fsattn_diffusers.recipe import PRESETS, Recipe


def test_changed_numerics_derive_a_name():
    r = PRESETS["mxfp8"].replace(proxy="u32")
    print(r.name)
    assert r.name == "mxfp8+proxy=u32" and r.proxy == "u32"
    two = PRESETS["mxfp6"].replace(rollback=False, tile_n=64)
    assert two.name == "mxfp6+rollback=False+tile_n=64"
    assert PRESETS["mxfp8"].replace(proxy="u32").replace(rollback=False).name == "mxfp8+proxy=u32+rollback=False"
    assert PRESETS["mxfp8"].name == "mxfp8"  # the preset itself is untouched


def test_explicit_name_and_no_op_keep_the_name():
    assert PRESETS["mxfp8"].replace(name="x", proxy="u32").name == "x"
    assert PRESETS["mxfp8"].replace(name="x").proxy == PRESETS["mxfp8"].proxy
    same = PRESETS["mxfp8"].replace(proxy="u16")  # already u16: same numerics, same name
    assert same == PRESETS["mxfp8"] and same.name == "mxfp8"


def test_unknown_field_is_one_line_value_error():
    with pytest.raises(ValueError) as info:
        PRESETS["mxfp8"].replace(nosuch=1)
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg and "nosuch" in msg
    assert all(f.name in msg for f in dataclasses.fields(Recipe))


def test_invalid_value_still_checked():
    with pytest.raises(ValueError, match="accepted"):
        PRESETS["mxfp8"].replace(proxy="u7")


def test_recipe_module_states_what_the_presets_do_and_holds_no_measurements():
    """The Q-smoothing docs match the presets (on in the defaults, off in ``-paper``); measured percentages, result
    files and dates live in docs/design.md, not in recipe.py."""
    import inspect
    import re

    from fsattn_diffusers import recipe

    assert PRESETS["mxfp8"].smooth_q and not PRESETS["mxfp8-paper"].smooth_q
    assert "stays off in the presets" not in Recipe.__doc__
    src = inspect.getsource(recipe)
    assert not re.search(r"\d%|results/|20\d\d-\d\d-\d\d|seed 0*2\b", src, re.I)


def test_bf16_means_stock_attention_and_the_emulated_preset_has_its_own_name(monkeypatch):
    """``bf16-emulated`` is the emulator's BF16 recipe; ``"bf16"`` as a policy is stock attention, and as a recipe
    name it still resolves to ``bf16-emulated`` with one deprecation notice per process."""
    import warnings

    from fsattn_diffusers import notices
    from fsattn_diffusers.integration.policy import parse_entry
    from fsattn_diffusers.recipe import get_recipe

    assert "bf16" not in PRESETS and PRESETS["bf16-emulated"].name == "bf16-emulated"
    assert parse_entry("bf16") is None  # the policy: stock attention
    monkeypatch.setattr(notices, "_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert get_recipe("bf16") is PRESETS["bf16-emulated"]
        changed = get_recipe("bf16+frozen_max")
    assert changed.name == "bf16-emulated+frozen_max" and changed.frozen_max
    msgs = [str(w.message) for w in caught if issubclass(w.category, notices.FSAttnWarning)]
    assert len(msgs) == 1 and "\n" not in msgs[0] and "'bf16-emulated'" in msgs[0]


def test_modes_are_enums_that_are_their_strings():
    """``Recipe.numerics`` and ``Recipe.key_order`` hold :class:`~fsattn_diffusers.recipe.Mode` members, which compare,
    hash, format and serialize as the strings they stand for."""
    import json

    from fsattn_diffusers.recipe import KeyOrder, Numerics

    r = PRESETS["mxfp8"].replace(numerics="sm90")
    assert r.numerics is Numerics.SM90 and r.numerics == "sm90" and PRESETS["mxfp8"].key_order is KeyOrder.DIAGONAL
    assert {"sm90": 1}[r.numerics] == 1 and hash(r) == hash(dataclasses.replace(r, numerics=Numerics.SM90))
    assert f"{r.numerics}" == str(r.numerics) == "sm90" and "numerics='sm90'" in repr(r)
    assert json.loads(json.dumps(dataclasses.asdict(r)))["key_order"] == "diagonal"
    with pytest.raises(ValueError, match="^Recipe.key_order='spiral' is not supported; accepted: natural, diagonal$"):
        Recipe(key_order="spiral")


def test_formats_and_scale_rules_are_modes_and_strings_still_work():
    """The operand formats, scale rules, exponential and proxy are :class:`~fsattn_diffusers.modes.Mode` members too:
    a string is accepted and normalized, records serialize the plain strings, and a recipe name's changes are parsed
    by the fields' types (an enum's string, a number, ``none``)."""
    import json

    from fsattn_diffusers.formats import E2M1, E4M3, MX_BLOCK, PFormat, QKFormat, ScaleRule, VFormat
    from fsattn_diffusers.recipe import Exponential, Proxy, get_recipe

    r = Recipe(qk_format="mxfp8", p_format="fp8_row", v_format="fp8_tensor", p_scale_rule="floor")
    assert r.qk_format is QKFormat.MXFP8 and r.p_format is PFormat.FP8_ROW and r.v_format is VFormat.FP8_TENSOR
    assert r.p_scale_rule is ScaleRule.FLOOR and r.qk_scale_rule is None and r.exponential is Exponential.EXACT
    assert r == Recipe(qk_format=QKFormat.MXFP8, p_format=PFormat.FP8_ROW, v_format=VFormat.FP8_TENSOR,
                       p_scale_rule=ScaleRule.FLOOR)
    assert r.qk_format == "mxfp8" and {"fp8_row": 1}[r.p_format] == 1 and f"{r.v_format}" == "fp8_tensor"
    rec = json.loads(json.dumps(dataclasses.asdict(r)))
    assert (rec["qk_format"], rec["p_format"], rec["p_scale_rule"]) == ("mxfp8", "fp8_row", "floor")
    with pytest.raises(ValueError, match="^Recipe.p_format='fp9' is not supported; accepted: fp32, bf16, fp8_row, "
                                         "mxfp6, mxfp4$"):
        Recipe(p_format="fp9")
    with pytest.raises(ValueError, match="^Recipe.v_scale_rule='nearest' is not supported"):
        Recipe(v_scale_rule="nearest")

    parsed = get_recipe("mxfp6+proxy=u32+p_scale_rule=ceil+rollback_floor_log2=none+frozen_max_offset_log2=0.5")
    assert parsed.proxy is Proxy.U32 and parsed.p_scale_rule is ScaleRule.CEIL and parsed.rollback_floor_log2 is None
    assert parsed.frozen_max_offset_log2 == 0.5 and get_recipe("mxfp8+rollback_cap_log2=24").rollback_cap_log2 == 24
    with pytest.raises(ValueError, match="^Recipe.tile_m='x' is not an integer$"):
        get_recipe("mxfp8+tile_m=x")

    # P's format, described in one place
    assert (PFormat.FP8_ROW.element, PFormat.FP8_ROW.default_scale_rule, PFormat.FP8_ROW.keys_per_scale(128)) == \
        (E4M3, ScaleRule.ROUND_UP_175, 128)
    assert (PFormat.MXFP4.element, PFormat.MXFP4.default_scale_rule, PFormat.MXFP4.keys_per_scale(128)) == \
        (E2M1, ScaleRule.CEIL, MX_BLOCK)
    assert PFormat.BF16.element is None and PFormat.BF16.keys_per_scale(128) is None
    assert QKFormat.MXFP6.mx_element is not None and QKFormat.INT8.mx_element is None
