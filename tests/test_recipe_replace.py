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
    files and dates live in benchmarks/NOTES.md, not in recipe.py."""
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
