"""HunyuanVideo processor on a tiny HunyuanVideo transformer: joint attention, padded text, refiner."""

import warnings

import pytest
import torch

import fsattn_diffusers
from fsattn_diffusers.integration import HunyuanVideoFSAttnProcessor, key_padding_lengths, self_attention_modules
from fsattn_diffusers.integration.tiny import HUNYUAN_POOLED_DIM, HUNYUAN_TEXT_DIM, tiny_hunyuan_transformer
from fsattn_diffusers.recipe import get_recipe
from tolerances import FP32_ACCUMULATED

EXACT_REL_BOUND = FP32_ACCUMULATED  # our joint path with FP32 attention vs stock SDPA
TEXT_LEN, VALID = 8, (5, 8)  # batch 0 has 3 padded text tokens, batch 1 none


pytestmark = pytest.mark.usefixtures("quiet_slow_backend_warning")


@pytest.fixture(scope="module")
def model():
    return tiny_hunyuan_transformer()


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 2, 8, 8, generator=g)  # 2 latent frames x 8 x 8 = 128 image tokens
    text = torch.randn(2, TEXT_LEN, HUNYUAN_TEXT_DIM, generator=g)
    mask = (torch.arange(TEXT_LEN)[None, :] < torch.tensor(VALID)[:, None]).long()
    pooled = torch.randn(2, HUNYUAN_POOLED_DIM, generator=g)
    return dict(hidden_states=x, timestep=torch.tensor([600.0, 600.0]), encoder_hidden_states=text,
                encoder_attention_mask=mask, pooled_projections=pooled, guidance=torch.tensor([6000.0, 6000.0]))


def _run(model, kwargs):
    with torch.no_grad():
        return model(**kwargs, return_dict=False)[0]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_targets_joint_attention_and_keeps_refiner_stock(model):
    names = [name for name, _, _ in self_attention_modules(model)]
    assert names == ["transformer_blocks.0.attn", "single_transformer_blocks.0.attn"]
    fsattn_diffusers.apply(model, policy="mxfp8", backend="emulator")
    try:
        refiner = model.context_embedder.token_refiner.refiner_blocks[0].attn.processor
        assert type(refiner).__name__ == "AttnProcessor2_0"
        assert isinstance(model.transformer_blocks[0].attn.processor, HunyuanVideoFSAttnProcessor)
    finally:
        fsattn_diffusers.remove(model)
    assert type(model.transformer_blocks[0].attn.processor).__name__ == "HunyuanVideoAttnProcessor2_0"


def test_bf16_identical_and_exact_close_with_padded_text(model):
    kwargs = _inputs()
    stock = _run(model, kwargs)
    fsattn_diffusers.apply(model, policy="bf16")
    bf16 = _run(model, kwargs)
    fsattn_diffusers.remove(model)
    fsattn_diffusers.apply(model, policy="exact", backend="emulator")
    exact = _run(model, kwargs)
    fsattn_diffusers.remove(model)
    print("bf16 max diff", (bf16 - stock).abs().max().item(), "exact rel err", _rel(exact, stock))
    assert torch.equal(bf16, stock)
    assert _rel(exact, stock) < EXACT_REL_BOUND


# Q smoothing (every slice, and the per-slice switch) reads the query mean: the processor passes the joint sequence's
# valid length as q_lens too, so the padded text queries do not count in it.
@pytest.mark.parametrize("policy", ["mxfp8", "mxfp4", "mxfp8+smooth_q+smooth_q_min_ratio=0", "mxfp8+smooth_q"])
def test_padded_text_tokens_do_not_change_image_outputs(model, policy):
    kwargs = _inputs()
    spec = get_recipe(policy) if "+" in policy else policy  # a recipe string is a Recipe policy
    handle = fsattn_diffusers.apply(model, policy=spec, backend="emulator")
    try:
        out = _run(model, kwargs)
        changed = dict(kwargs)
        text = kwargs["encoder_hidden_states"].clone()
        text[0, VALID[0]:] = 1e3 * torch.randn(TEXT_LEN - VALID[0], HUNYUAN_TEXT_DIM)  # padded tokens only
        changed["encoder_hidden_states"] = text
        out_changed = _run(model, changed)
    finally:
        fsattn_diffusers.remove(model)
    print(policy, "max diff after changing padded tokens", (out - out_changed).abs().max().item())
    assert torch.isfinite(out).all()
    assert torch.equal(out, out_changed)
    assert {r.recipe for r in handle.records} == {policy}


def test_key_padding_lengths():
    n = 6
    prefix = (torch.arange(n)[None, :] < torch.tensor([4, 6])[:, None])[:, None, None, :]
    lens, ok = key_padding_lengths(prefix, 2, n)
    assert ok and lens.tolist() == [4, 6]
    assert key_padding_lengths(torch.ones(2, 1, 1, n, dtype=torch.bool), 2, n) == (None, True)
    assert key_padding_lengths(None, 2, n) == (None, True)
    hole = prefix.clone()
    hole[0, 0, 0, 1] = False
    assert key_padding_lengths(hole, 2, n) == (None, False)
    assert key_padding_lengths(prefix.float(), 2, n) == (None, False)  # additive masks: not ours
    assert key_padding_lengths(prefix.expand(2, 1, n, n), 2, n) == (None, False)


def test_non_prefix_mask_falls_back_to_stock_with_warning(model):
    attn = model.transformer_blocks[0].attn
    g = torch.Generator().manual_seed(1)
    img, txt = torch.randn(1, 16, 128, generator=g), torch.randn(1, 4, 128, generator=g)
    mask = torch.ones(1, 1, 1, 20, dtype=torch.bool)
    mask[..., 17] = False  # a hole, then a valid key: not a key-padding prefix
    stock = type(attn.processor)()(attn, img, txt, mask)
    proc = HunyuanVideoFSAttnProcessor("mxfp8", backend="emulator")
    proc.tracker.record = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = proc(attn, img, txt, mask)
    print([str(w.message) for w in caught], proc.tracker.records)
    assert torch.equal(ours[0], stock[0]) and torch.equal(ours[1], stock[1])
    assert proc.tracker.records[-1].recipe == "bf16" and "prefix" in proc.tracker.records[-1].note


def test_one_processor_for_whole_model_keeps_refiner_working(model):
    kwargs = _inputs()
    fsattn_diffusers.apply(model, policy="exact", backend="emulator")
    by_apply = _run(model, kwargs)
    fsattn_diffusers.remove(model)
    saved = dict(model.attn_processors)
    model.set_attn_processor(HunyuanVideoFSAttnProcessor("exact", backend="emulator"))
    try:
        whole = _run(model, kwargs)
    finally:
        model.set_attn_processor(dict(saved))
    assert torch.equal(whole, by_apply)
