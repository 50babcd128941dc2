"""Attention-level diagnostics of approximate probabilities against exact softmax, on sampled rows.

For rows of exact probabilities ``p`` (fp32 softmax of fp32 scores) and approximate ones ``p~`` over
the valid keys, :class:`Diagnostics` accumulates (pooled over every row added):

* mass concentration of ``p`` (``ref_*``) and of ``p~``: ``share_hi`` = share of valid positions with
  weight >= 0.1, ``mass_hi`` = the weight they carry per row; ``share_lo`` / ``mass_lo`` the same for
  weight < 1e-4;
* ``zero_share``: share of valid positions ``p~`` sets to 0 (dropped keys, lattice underflow) and
  ``dropped_mass``: the exact weight they had, per row;
* ``log_rmse``: unweighted root-mean-square of ``ln p~ - ln p`` over valid positions where both are
  positive (every position counts equally);
* ``weighted_log_err``: the same error weighted by ``p`` (``sqrt(sum p d^2 / sum p)``);
* ``jsd``: mean over rows of the Jensen-Shannon divergence of ``p`` and ``p~`` in nats (at most ln 2);
* ``out_rel_err`` (when outputs are added): ``||o~ - o|| / ||o||`` of the attention outputs of the rows.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import torch

from ..interventions import jsd_rows

#: Thresholds of the mass-concentration fields.
HIGH, LOW = 0.1, 1e-4
#: Fields of :meth:`Diagnostics.result`, in report order.
FIELDS = ("jsd", "log_rmse", "weighted_log_err", "out_rel_err", "zero_share", "dropped_mass", "share_hi",
          "mass_hi", "share_lo", "mass_lo", "ref_share_hi", "ref_mass_hi", "ref_share_lo", "ref_mass_lo")
#: Score elements per chunk in :func:`call_diagnostics`.
CHUNK_ELEMENTS = 1 << 24

_SUMS = ("rows", "valid", "ref_hi_n", "ref_hi_w", "ref_lo_n", "ref_lo_w", "hi_n", "hi_w", "lo_n", "lo_w", "zero_n",
         "dropped_w", "log_sq", "log_n", "wlog_sq", "wlog_w", "jsd", "out_sq", "ref_sq")


class Diagnostics:
    """Running sums of the diagnostics; :meth:`add` rows, :meth:`result` the values."""

    def __init__(self):
        self.sums = {k: 0.0 for k in _SUMS}

    def add(self, p_ref: torch.Tensor, p: torch.Tensor, valid: Optional[torch.Tensor] = None,
            o_ref: Optional[torch.Tensor] = None, o: Optional[torch.Tensor] = None) -> "Diagnostics":
        """Add rows ``p_ref``, ``p`` (..., S_k) (``valid`` broadcastable bool, default all) and optionally
        the rows' outputs ``o_ref``, ``o`` (..., D)."""
        ok = torch.ones_like(p_ref, dtype=torch.bool) if valid is None else valid.expand_as(p_ref)
        r, t = p_ref.to(torch.float64), p.to(torch.float64)
        zero64 = torch.zeros((), dtype=torch.float64, device=r.device)
        wsum = lambda mask, x: torch.where(mask, x, zero64).sum()  # noqa: E731
        vals = {"rows": ok.any(dim=-1).sum(), "valid": ok.sum()}
        for prefix, x in (("ref_", r), ("", t)):
            hi, lo = ok & (x >= HIGH), ok & (x < LOW)
            vals.update({prefix + "hi_n": hi.sum(), prefix + "hi_w": wsum(hi, x), prefix + "lo_n": lo.sum(),
                         prefix + "lo_w": wsum(lo, x)})
        zero = ok & (t == 0)
        both = ok & (t > 0) & (r > 0)
        one = torch.ones((), dtype=torch.float64, device=r.device)
        d = torch.where(both, torch.log(torch.where(both, t, one)) - torch.log(torch.where(both, r, one)), zero64)
        vals.update({"zero_n": zero.sum(), "dropped_w": wsum(zero, r), "log_sq": (d * d).sum(), "log_n": both.sum(),
                     "wlog_sq": (r * d * d).sum(), "wlog_w": wsum(both, r),
                     "jsd": wsum(ok.any(dim=-1), jsd_rows(torch.where(ok, r, zero64), torch.where(ok, t, zero64)))})
        if o_ref is not None and o is not None:
            vals["out_sq"] = ((o.to(torch.float64) - o_ref.to(torch.float64)) ** 2).sum()
            vals["ref_sq"] = (o_ref.to(torch.float64) ** 2).sum()
        names = list(vals)
        for name, x in zip(names, torch.stack([vals[n].to(torch.float64) for n in names]).tolist()):
            self.sums[name] += x
        return self

    def result(self) -> Dict[str, float]:
        """The :data:`FIELDS` (NaN where nothing was added; ``out_rel_err`` NaN without outputs)."""
        s = self.sums
        div = lambda a, b: s[a] / s[b] if s[b] > 0 else math.nan  # noqa: E731
        out = {"jsd": div("jsd", "rows"), "log_rmse": math.sqrt(div("log_sq", "log_n")) if s["log_n"] else math.nan,
               "weighted_log_err": math.sqrt(div("wlog_sq", "wlog_w")) if s["wlog_w"] else math.nan,
               "out_rel_err": math.sqrt(div("out_sq", "ref_sq")) if s["ref_sq"] else math.nan,
               "zero_share": div("zero_n", "valid"), "dropped_mass": div("dropped_w", "rows")}
        for prefix in ("ref_", ""):
            out[prefix + "share_hi"] = div(prefix + "hi_n", "valid")
            out[prefix + "mass_hi"] = div(prefix + "hi_w", "rows")
            out[prefix + "share_lo"] = div(prefix + "lo_n", "valid")
            out[prefix + "mass_lo"] = div(prefix + "lo_w", "rows")
        return {k: out[k] for k in FIELDS}


def call_diagnostics(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, interventions: Sequence, *,
                     scale: Optional[float], kv_len: Optional[int] = None,
                     chunk_elements: int = CHUNK_ELEMENTS) -> Dict[str, Dict[str, float]]:
    """Diagnostics of each intervention on one call's rows (all heads, all keys).

    Parameters
    ----------
    q : Tensor (H, R, D) — the sampled query rows; k, v : Tensor (H, S_k, D) — never modified.
    interventions : Intervention objects or labels
    scale : softmax scale (default ``D ** -0.5``)
    kv_len : valid keys (a prefix), default all
    chunk_elements : scores held at once (heads are processed in chunks)

    Returns
    -------
    ``{label: {field: value}}`` (:data:`FIELDS`), ``out_rel_err`` against exact fp32 attention; ``alpha``
    too for ``flatten`` / ``sharpen`` (the scale matched on these rows).
    """
    from ..interventions import Intervention, Kind, parse_intervention, resolve_for_call, valid_keys, weights

    ivs = [parse_intervention(i) for i in interventions]
    h, r, d = q.shape
    s_k = k.shape[1]
    scale = d ** -0.5 if scale is None else float(scale)
    resolved = [resolve_for_call(iv, q, k, scale=scale, kv_len=kv_len) for iv in ivs]
    valid = valid_keys(s_k, kv_len, q.device)
    exact = Intervention(Kind.EXACT)
    acc = {iv.label: Diagnostics() for iv in ivs}
    step = max(1, chunk_elements // max(1, r * s_k))
    with torch.no_grad():
        for h0 in range(0, h, step):
            vb = v[h0:h0 + step].to(torch.float32)
            s = torch.matmul(q[h0:h0 + step].to(torch.float32), k[h0:h0 + step].to(torch.float32).transpose(-1, -2))
            s = s * scale
            p_ref = weights(s, exact, valid)
            o_ref = torch.matmul(p_ref, vb)
            for iv, use in zip(ivs, resolved):
                p = weights(s, use, valid)
                acc[iv.label].add(p_ref, p, valid, o_ref, torch.matmul(p, vb))
    out = {label: a.result() for label, a in acc.items()}
    for iv, use in zip(ivs, resolved):
        if use is not iv:  # a JSD-matched scaling: the alpha chosen for this call
            out[iv.label]["alpha"] = use.alpha
    return out


def flat_fields(diag: Dict[str, Dict[str, float]]) -> Dict[str, float]:
    """``{label: {field: v}}`` as one row: ``p_<field>`` for the exact distribution's concentration
    (taken from the first label) and ``<label>_<field>`` for the rest."""
    row: Dict[str, float] = {}
    for n, (label, values) in enumerate(diag.items()):
        for f, x in values.items():
            if f.startswith("ref_"):
                if n == 0:
                    row["p_" + f[len("ref_"):]] = x
            else:
                row[f"{label}_{f}"] = x
    return row
