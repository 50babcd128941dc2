"""quality_vs_time.png: the labels of policies on the same (or a nearby) point stay readable."""

import itertools

import pytest

pytest.importorskip("matplotlib")

from fsattn_diffusers.quality import plots  # noqa: E402

MEANS = [
    {"policy": "bf16", "step_s": 0.05, "psnr_db": float("inf"), "ssim": 1.0},
    {"policy": "mxfp8", "step_s": 0.20, "psnr_db": 38.0, "ssim": 0.99},
    {"policy": "mxfp6", "step_s": 0.30, "psnr_db": 31.0, "ssim": 0.95},
    {"policy": "hybrid", "step_s": 0.30, "psnr_db": 31.0, "ssim": 0.95},  # hybrid = mxfp6 at 2 steps
    {"policy": "mxfp6:3,mxfp4:14,mxfp6:3", "step_s": 0.305, "psnr_db": 30.8, "ssim": 0.949},
    {"policy": "mxfp4", "step_s": 0.29, "psnr_db": 25.0, "ssim": 0.90},
]


def _figures_of(monkeypatch):
    figures = []
    original = plots._figure

    def keep(*args):
        fig = original(*args)
        figures.append(fig)
        return fig

    monkeypatch.setattr(plots, "_figure", keep)
    return figures


def test_coincident_points_share_a_label_and_no_labels_overlap(tmp_path, monkeypatch):
    figures = _figures_of(monkeypatch)
    path = plots.plot_quality_vs_time(MEANS, str(tmp_path / "quality_vs_time.png"), lpips_available=False)
    assert (tmp_path / "quality_vs_time.png").stat().st_size > 0 and path.endswith(".png")
    fig = figures[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.texts if "reference" not in t.get_text()]
        texts = sorted(t.get_text() for t in labels)
        print(texts)
        assert texts == sorted(["mxfp8", "mxfp6, hybrid", "mxfp6:3,mxfp4:14,mxfp6:3", "mxfp4"])
        boxes = [t.get_window_extent(renderer) for t in labels]
        overlaps = [(labels[i].get_text(), labels[j].get_text())
                    for i, j in itertools.combinations(range(len(boxes)), 2) if boxes[i].overlaps(boxes[j])]
        assert overlaps == []



def test_ssim_is_drawn_as_one_minus_ssim_on_a_log_axis(tmp_path, monkeypatch):
    figures = _figures_of(monkeypatch)
    close = [dict(m, ssim=1 - 10 ** -(3 + i)) for i, m in enumerate(MEANS)]  # 1 - SSIM from 1e-4 to 1e-8
    plots.plot_quality_vs_time(close, str(tmp_path / "q.png"), lpips_available=False)
    ax = figures[0].axes[1]
    assert ax.get_yscale() == "log" and ax.get_title().startswith("1 − SSIM")
    ys = sorted(float(c.get_offsets()[0][1]) for c in ax.collections)
    assert ys == pytest.approx(sorted(1 - m["ssim"] for m in close[1:]), rel=1e-6)
    low, high = ax.get_ylim()
    assert high / low > 100  # the decades apart are visible, not squeezed into the 7th decimal


def test_the_per_frame_title_explains_the_triangle_only_where_one_is_drawn(tmp_path, monkeypatch):
    figures = _figures_of(monkeypatch)
    curves = {"p00": {"mxfp8": ([0, 4], [40.0, 41.0])}, "p01": {"mxfp8": ([0, 4], [float("inf"), 39.0])}}
    plots.plot_psnr_per_frame(curves, str(tmp_path / "f.png"))
    titles = [ax.get_title() for ax in figures[0].axes]
    assert titles[0] == "p00" and "▲" in titles[1]
