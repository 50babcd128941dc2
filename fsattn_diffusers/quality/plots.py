"""PNG figures with matplotlib's Agg canvas (no pyplot state, no display needed).

* :func:`plot_quality_vs_time` — one point per policy: mean PSNR / 1 − SSIM (log axis) / LPIPS against mean time
  per denoising step (bf16, whose PSNR is infinite, is the dashed reference line).
* :func:`plot_psnr_per_frame` — PSNR of each compared frame, one panel per prompt, one line per policy.
* :func:`plot_frame_grid` — bf16 and each policy side by side at a few frames (paper Figure 4 style).
* :func:`plot_rollback_heatmap` — ``fsattn capture``: rollback rate per denoising step and layer.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

#: Size of one frame-grid cell (inches) and the resolution of every figure.
GRID_CELL_IN = 2.0
DPI = 110
#: Panels per row of the per-frame PSNR figure.
PANELS_PER_ROW = 3
#: Series colours: matplotlib's tab20 (20 distinct colours; past 20 the marker changes too).
SERIES_CMAP = "tab20"
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def need_matplotlib():
    """Import matplotlib's Figure (Agg canvas) or raise a one-line ImportError."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots need matplotlib: pip install matplotlib "
                          "(or pip install 'fsattn-diffusers[metrics]')") from None
    return Figure, FigureCanvasAgg


def _figure(width: float, height: float):
    Figure, Canvas = need_matplotlib()
    fig = Figure(figsize=(width, height), dpi=DPI)
    Canvas(fig)
    return fig


def series_styles(labels: Sequence[str]) -> Dict[str, Tuple[tuple, str]]:
    """``{label: (RGBA colour, marker)}``: a distinct colour per label from :data:`SERIES_CMAP`, in order, and
    a different marker for each further run of 20 labels, so no two labels share both."""
    from matplotlib import colormaps

    cmap = colormaps[SERIES_CMAP]
    # tab20 holds 10 hues in dark/light pairs: the 10 dark ones first, so up to 10 series differ in hue
    order = list(range(0, cmap.N, 2)) + list(range(1, cmap.N, 2))
    out = {}
    for i, label in enumerate(dict.fromkeys(labels)):
        out[label] = (tuple(cmap(order[i % cmap.N])), SERIES_MARKERS[(i // cmap.N) % len(SERIES_MARKERS)])
    return out


def _legend_beside(fig, handles, labels) -> None:
    """One legend for the whole figure, to the right of every panel (never over a curve)."""
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False,
                   ncol=1 if len(labels) <= 24 else 2)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def label_groups(points: List[tuple], tol: float = 0.02, near: Tuple[float, float] = (0.25, 0.12)) -> List[tuple]:
    """Merge the labels of points that coincide on the plot, and stagger the labels of nearby ones.

    Parameters
    ----------
    points : list of (label, x, y)
    tol : float
        Points closer than ``tol`` of the data's x span and of its y span coincide (one label).
    near : (float, float)
        Distinct points closer than these fractions of the x and y spans are near: their labels go on
        different text rows.

    Returns
    -------
    list of (labels, x, y, row)
        One entry per distinct position, labels in input order, sorted by decreasing y then x; ``row``
        is the number of earlier entries near this one (the plot moves its label down by that many rows).
    """
    if not points:
        return []
    xs, ys = [p[1] for p in points], [p[2] for p in points]
    xspan = (max(xs) - min(xs)) or abs(xs[0]) or 1.0
    yspan = (max(ys) - min(ys)) or abs(ys[0]) or 1.0
    groups: List[list] = []
    for label, x, y in points:
        for g in groups:
            if abs(g[1] - x) <= tol * xspan and abs(g[2] - y) <= tol * yspan:
                g[0].append(label)
                break
        else:
            groups.append([[label], x, y])
    ordered = sorted(((g[0], g[1], g[2]) for g in groups), key=lambda g: (-g[2], g[1]))
    out = []
    for labels, x, y in ordered:
        rows = {row for _, px, py, row in out if abs(px - x) <= near[0] * xspan and abs(py - y) <= near[1] * yspan}
        out.append((labels, x, y, next(r for r in range(len(out) + 1) if r not in rows)))
    return out


def _one_minus(value):
    return 1.0 - value if _finite(value) else None


def plot_quality_vs_time(means: List[Dict], path: str, lpips_available: bool) -> str:
    """Mean quality per policy against mean seconds per denoising step.

    SSIM is drawn as 1 − SSIM on a log axis: near 1 its differences are in the 4th to 7th decimal, which linear
    ticks cannot show; a policy with SSIM exactly 1 (identical to bf16) has no point there.
    """
    metrics = [("psnr_db", "PSNR vs bf16 (dB, higher is better)", None, False),
               ("ssim", "1 − SSIM vs bf16 (log scale, lower is better)", _one_minus, True)]
    if lpips_available:
        metrics.append(("lpips", "LPIPS vs bf16 (lower is better)", None, False))
    fig = _figure(4.2 * len(metrics), 3.6)
    ref = next((m for m in means if m["policy"] == "bf16"), None)
    styles = series_styles([m["policy"] for m in means if m["policy"] != "bf16"])
    legend = {}
    for i, (key, title, transform, log) in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), i + 1)
        points = [(m["policy"], m.get("step_s"), (transform or (lambda v: v))(m.get(key)))
                  for m in means if m["policy"] != "bf16"]
        points = [(label, x, y) for label, x, y in points if _finite(x) and _finite(y) and (y > 0 or not log)]
        for label, x, y in points:
            color, marker = styles[label]
            legend.setdefault(label, ax.scatter([x], [y], s=36, color=[color], marker=marker, label=label))
        if log:
            ax.set_yscale("log")
        # coincident points share one label; labels of nearby points go on separate rows (log axes: in log10 y)
        for labels, x, _, row in label_groups([(lb, x, math.log10(y) if log else y) for lb, x, y in points]):
            y = next(py for lb, _, py in points if lb == labels[0])
            ax.annotate(", ".join(labels), (x, y), textcoords="offset points", xytext=(4, 4 - 10 * row), fontsize=8)
        if ref is not None and _finite(ref.get("step_s")):
            ax.axvline(ref["step_s"], color="0.4", linestyle="--", linewidth=1)
            ax.annotate("bf16 (reference)", (ref["step_s"], 0.02), xycoords=("data", "axes fraction"),
                        rotation=90, fontsize=7, color="0.3", xytext=(3, 0), textcoords="offset points")
        ax.margins(x=0.15, y=0.1)  # room for the labels of the outermost points
        ax.set_xlabel("time per denoising step (s)")
        if not log:
            ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _legend_beside(fig, list(legend.values()), list(legend))
    fig.savefig(path, bbox_inches="tight")
    return path


def plot_psnr_per_frame(curves: Dict[str, Dict[str, tuple]], path: str) -> str:
    """``curves[prompt_id][policy] = (frame indices, PSNR values)``.

    Finite values are lines; an identical frame (PSNR ``inf``) is a triangle on the top edge, and a panel's title
    explains the triangle only when the panel draws one.
    """
    from matplotlib.ticker import MaxNLocator
    from matplotlib.transforms import blended_transform_factory

    panels = list(curves)
    cols = max(1, min(PANELS_PER_ROW, len(panels)))
    rows = max(1, math.ceil(len(panels) / cols))
    fig = _figure(4.2 * cols, 3.2 * rows)
    styles = series_styles([policy for pid in panels for policy in curves[pid]])
    legend = {}
    for n, pid in enumerate(panels):
        ax = fig.add_subplot(rows, cols, n + 1)
        top = blended_transform_factory(ax.transData, ax.transAxes)
        identical = False
        for policy, (idx, values) in curves[pid].items():
            pts = [(i, v) for i, v in zip(idx, values) if _finite(v)]
            infs = [i for i, v in zip(idx, values) if not _finite(v)]
            color, marker = styles[policy]
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, markersize=3, label=policy,
                           color=color)[0]
            legend.setdefault(policy, line)
            if infs:
                identical = True
                ax.plot(infs, [1.0] * len(infs), linestyle="none", marker="^", markersize=6, clip_on=False,
                        color=line.get_color(), transform=top)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(pid + ("  (▲ on the top edge: frame identical to bf16, PSNR inf)" if identical else ""),
                     fontsize=8)
        ax.set_xlabel("frame")
        ax.set_ylabel("PSNR vs bf16 (dB)")
        ax.grid(True, alpha=0.3)
    if not panels:
        fig.text(0.5, 0.5, "no video could be compared with bf16", ha="center")
    fig.tight_layout()
    _legend_beside(fig, list(legend.values()), list(legend))
    fig.savefig(path, bbox_inches="tight")
    return path


def pick_columns(indices: Sequence[int], count: int) -> List[int]:
    """``count`` frame indices spread evenly over ``indices`` (first and last included)."""
    if count >= len(indices):
        return list(indices)
    picks = np.linspace(0, len(indices) - 1, count).round().astype(int)
    return [indices[i] for i in dict.fromkeys(picks.tolist())]


def plot_frame_grid(rows: List[tuple], columns: Sequence[int], path: str, title: str = "") -> str:
    """Rows ``(label, frames (len(columns), H, W, 3) uint8, captions or None)``, one column per frame."""
    if not rows:
        raise ValueError("a frame grid needs at least one row")
    h, w = rows[0][1].shape[1:3]
    cell_w = GRID_CELL_IN
    cell_h = GRID_CELL_IN * h / w
    fig = _figure(cell_w * len(columns) + 1.2, cell_h * len(rows) + 0.8)
    for r, (label, frames, captions) in enumerate(rows):
        for c, frame_index in enumerate(columns):
            ax = fig.add_subplot(len(rows), len(columns), r * len(columns) + c + 1)
            ax.imshow(frames[c], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"frame {frame_index}", fontsize=8)
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
            if captions is not None:
                ax.set_xlabel(captions[c], fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_rollback_heatmap(grids: Dict[str, np.ndarray], layers: List[str], steps: List[int], path: str) -> str:
    """One heatmap per recipe, stacked: ``grids[recipe][layer, step]`` = rollback rate (NaN = no call).

    Each panel is at most 11 inches wide whatever the step count, and at least 1.8 inches high per recipe.
    """
    names = list(grids)
    width = min(11.0, max(5.0, 0.3 * len(steps) + 3.5))
    panel_h = max(1.8, 0.22 * len(layers) + 1.2)
    fig = _figure(width, panel_h * max(1, len(names)) + 0.4)
    tick_every = max(1, math.ceil(len(steps) / 40))
    for n, name in enumerate(names):
        ax = fig.add_subplot(max(1, len(names)), 1, n + 1)
        data = np.ma.masked_invalid(grids[name])
        top = float(np.nanmax(grids[name])) if np.isfinite(grids[name]).any() else 0.0
        im = ax.imshow(data, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0,
                       vmax=top if top > 0 else 1.0)
        ax.set_title(f"{name}: rollback rate (max {top:.3g})", fontsize=9)
        ax.set_xlabel("denoising step", fontsize=8)
        ticks = list(range(0, len(steps), tick_every))
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(steps[t]) for t in ticks], fontsize=7)
        ax.set_yticks(range(len(layers)))
        ax.set_yticklabels(layers, fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02)
    if any(np.isnan(g).any() for g in grids.values()):
        fig.suptitle("blank cells: no call of that layer at that step (e.g. the other Wan2.2 expert ran)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def caption(value: Optional[float]) -> str:
    """A grid caption for a frame's PSNR."""
    if value is None:
        return ""
    return "PSNR inf" if math.isinf(value) else f"PSNR {value:.2f} dB"
