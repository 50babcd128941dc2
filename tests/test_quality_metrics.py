"""Metric oracles: identical frames, a known noise against the PSNR formula, LPIPS availability and loading."""

import math

import numpy as np
import pytest
import torch

from fsattn_diffusers.quality import lpips_metric
from fsattn_diffusers.quality.metrics import compare_frames, frame_indices, mse, psnr, psnr_from_mse, ssim
from tolerances import FP64_SLACK

pytest.importorskip("skimage")

GRAY, SIZE = 128, 48


def frames(n=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(16, 240, size=(n, SIZE, SIZE, 3), dtype=np.uint8)


def sign_noise(shape, sigma, seed):
    """A noise of exactly +-sigma per pixel: its MSE is sigma^2 whatever the signs."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(shape) < 0.5, -sigma, sigma).astype(np.int16)


def test_identical_frames_give_inf_psnr_and_ssim_one():
    ref = frames()
    m = compare_frames(ref, ref.copy(), [0, 4, 8])
    print("psnr", m.psnr, "ssim", m.ssim, "means", m.means)
    assert all(math.isinf(p) and p > 0 for p in m.psnr)
    assert m.means["psnr"] == math.inf and m.means["mse"] == 0.0
    assert m.ssim == [1.0, 1.0, 1.0] and m.means["ssim"] == 1.0


@pytest.mark.parametrize("sigma", [1, 5, 20])
def test_known_noise_gives_the_formula_psnr(sigma):
    ref = np.full((2, SIZE, SIZE, 3), GRAY, dtype=np.uint8)
    test = (ref.astype(np.int16) + sign_noise(ref.shape, sigma, sigma)).astype(np.uint8)
    expected = 20 * math.log10(255 / sigma)  # 10 log10(255^2 / sigma^2)
    m = compare_frames(ref, test, [0, 4])
    print(f"sigma {sigma}: psnr per frame {m.psnr}, pooled {m.means['psnr']}, formula {expected}")
    for p in m.psnr:
        assert p == pytest.approx(expected, abs=FP64_SLACK)
    assert m.means["psnr"] == pytest.approx(expected, abs=FP64_SLACK)
    assert m.means["ssim"] < 1.0


def test_video_psnr_pools_the_mse_so_one_identical_frame_is_not_inf():
    ref = np.full((2, SIZE, SIZE, 3), GRAY, dtype=np.uint8)
    test = ref.copy()
    test[1] = (ref[1].astype(np.int16) + sign_noise(ref[1].shape, 4, 0)).astype(np.uint8)
    m = compare_frames(ref, test, [0, 4])
    expected = 10 * math.log10(255 ** 2 / ((0 + 16) / 2))
    print("per frame", m.psnr, "video", m.means["psnr"], "formula", expected)
    assert math.isinf(m.psnr[0]) and math.isfinite(m.psnr[1])
    assert m.means["psnr"] == pytest.approx(expected, abs=FP64_SLACK)


def test_single_frame_helpers_and_errors():
    a, b = frames(2)
    print("psnr", psnr(a, b), "mse", mse(a, b), "ssim", ssim(a, b))
    assert psnr(a, b) == pytest.approx(psnr_from_mse(mse(a, b)), abs=FP64_SLACK)
    assert -1.0 <= ssim(a, b) < 1.0
    assert psnr_from_mse(0.0) == math.inf
    with pytest.raises(ValueError, match="shape"):
        psnr(a, b[:8])
    with pytest.raises(ValueError, match="uint8"):
        psnr(a.astype(np.float32), b.astype(np.float32))


def test_frame_indices():
    assert frame_indices(17, 4) == [0, 4, 8, 12, 16]
    assert frame_indices(5, 1) == [0, 1, 2, 3, 4]
    assert frame_indices(81) == list(range(0, 81, 4))
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="every"):
            frame_indices(17, bad)


def _lpips_imports() -> bool:
    return "does not import" not in (lpips_metric.load_lpips(weights="/nonexistent").reason or "")


def test_lpips_without_weights_is_unavailable_with_a_one_line_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty torch cache
    metric = lpips_metric.load_lpips()
    print("LPIPS:", metric.describe())
    assert not metric.available
    assert metric.reason.startswith("LPIPS unavailable: ") and "\n" not in metric.reason
    assert ("does not import" in metric.reason) or (lpips_metric.ALEXNET_WEIGHTS_FILE in metric.reason)
    ref = frames(2)
    m = compare_frames(ref, ref, [0, 4], metric)
    assert m.lpips is None and m.means["lpips"] is None and m.lpips_note == metric.reason
    with pytest.raises(RuntimeError, match="LPIPS unavailable"):
        metric.score(ref, ref)


ALEXNET_FEATURES = {0: (64, 3, 11), 3: (192, 64, 5), 6: (384, 192, 3), 8: (256, 384, 3), 10: (256, 256, 3)}


def _write_alexnet_weights(path, drop=None):
    gen = torch.Generator().manual_seed(0)
    state = {}
    for i, (cout, cin, k) in ALEXNET_FEATURES.items():
        if i == drop:
            continue
        state[f"features.{i}.weight"] = torch.randn(cout, cin, k, k, generator=gen) * 0.05
        state[f"features.{i}.bias"] = torch.randn(cout, generator=gen) * 0.01
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state


@pytest.mark.skipif(not _lpips_imports(), reason="the lpips package does not import here (it needs torchvision)")
def test_lpips_loads_a_weights_file_from_the_torch_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path = tmp_path / "hub" / "checkpoints" / lpips_metric.ALEXNET_WEIGHTS_FILE
    state = _write_alexnet_weights(path)
    metric = lpips_metric.load_lpips()
    print("LPIPS:", metric.describe())
    assert metric.available and metric.weights == str(path)
    loaded = metric.model.net.state_dict()
    for name, value in loaded.items():
        assert torch.equal(value, state["features." + name.split(".", 1)[1]]), name
    ref = frames(2)
    noisy = (ref.astype(np.int16) + sign_noise(ref.shape, 30, 1)).clip(0, 255).astype(np.uint8)
    same, diff = metric.score(ref, ref), metric.score(ref, noisy)
    print("LPIPS identical", same, "noisy", diff)
    assert same == [0.0, 0.0] and all(d > 0 for d in diff)
    m = compare_frames(ref, ref, [0, 4], metric)
    assert m.means["lpips"] == 0.0


@pytest.mark.skipif(not _lpips_imports(), reason="the lpips package does not import here (it needs torchvision)")
def test_lpips_with_an_incomplete_weights_file_is_unavailable(tmp_path):
    path = tmp_path / "alexnet.pth"
    _write_alexnet_weights(path, drop=6)
    metric = lpips_metric.load_lpips(weights=str(path))
    print("LPIPS:", metric.describe())
    assert not metric.available and "cannot load" in metric.reason and "features.6" in metric.reason
