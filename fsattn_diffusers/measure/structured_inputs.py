"""Named families of structured attention inputs (the ``fsattn accuracy --suite structured`` inputs).

Every generator has the signature ``gen(B, H, S, D, dtype, device, seed) -> (q, k, v)`` and returns
three new tensors of shape (B, H, S, D) (layout BHSD) in ``dtype`` on ``device``. The values are drawn
in float32 on the CPU from ``torch.Generator().manual_seed(seed)`` (so CPU and GPU runs see the same
inputs), shaped, then rounded to ``dtype``. The base of every family is standard-normal Q, K, V; each
family adds one structure seen in trained attention:

=========================  ===========================================================================
family                     structure
=========================  ===========================================================================
``gaussian``               Q, K, V ~ N(0, 1)
``k_channel_outliers``     4 channels of K (per head) scaled by a factor drawn from [10, 20]
``offset_uniform_{q,k,qk}``  +3 on every channel of every token, on Q, K or both
``offset_sparse_{q,k,qk}``   +10 on 4 channels (per head) of every token, on Q, K or both
``offset_direction_{q,k,qk}``  one random direction per head of norm 3 sqrt(D) (34 at D = 128) added
                           to every token (the same vector for Q and K), on Q, K or both
``v_channel_outliers``     4 channels of V (per head) scaled by a factor drawn from [10, 20]
``sharp``                  Q multiplied by 4 (scores x4)
``locality``               Q and K each get ``phi(pos)``: cos/sin of the token position times D/2
                           frequencies spaced geometrically from 1 to 1/S (a RoPE-like shared
                           component), so ``phi(i) . phi(j)`` depends on ``|i - j|`` and nearby tokens
                           attend to each other (score bump ``sqrt(D) / 2`` at distance 0)
``attention_sink``         key 0 is ``s u`` (u a unit direction per head) and every query gets ``4 u``,
                           with ``s`` set so that the sink's score is ``ln(S) + 4`` above the others:
                           every row puts most of its mass on key 0
``clustered``              patch-like tokens: q, k, v of each token drawn around one of 16 centres per head,
                           so rows attend sharply within their cluster (recipe error ~1%: a kernel's own
                           deviation from its reference shows here)
=========================  ===========================================================================

:data:`FAMILIES` maps each name to its generator and :data:`DESCRIPTIONS` to its one-line description.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Tuple

import torch

Tensors = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Generator = Callable[..., Tensors]

#: Number of channels that carry an outlier or a sparse offset.
OUTLIER_CHANNELS = 4
UNIFORM_OFFSET = 3.0
SPARSE_OFFSET = 10.0
SHARP_FACTOR = 4.0
SINK_QUERY_SHIFT = 4.0
SINK_MARGIN = 4.0
#: ``clustered``: tokens per head drawn around this many centres (image patches of a few kinds of content), the
#: per-token spread around the centre for Q/K and for V, and the factor on Q and K (scores between tokens of one
#: cluster ~ SCALE^2 sqrt(D), about 11 nats at D = 128: sharp, block-structured rows).
CLUSTERS = 16
CLUSTER_QK_SPREAD = 0.5
CLUSTER_V_SPREAD = 0.3
CLUSTER_QK_SCALE = 0.5


def _check(b: int, h: int, s: int, d: int, dtype: torch.dtype) -> None:
    for name, value in (("B", b), ("H", h), ("S", s), ("D", d)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {dtype} is not supported; accepted: float16, bfloat16, float32")


def _base(b, h, s, d, seed):
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
    return gen, q, k, v


def _finish(q, k, v, dtype, device) -> Tensors:
    return tuple(t.to(dtype).to(device) for t in (q, k, v))


def _channels(gen, h, d, count=OUTLIER_CHANNELS) -> torch.Tensor:
    """(H, count) distinct channel indices per head."""
    return torch.stack([torch.randperm(d, generator=gen)[:count] for _ in range(h)])


def _per_channel(gen, h, d, value_fn) -> torch.Tensor:
    """(H, D) per-channel vector, zero except on OUTLIER_CHANNELS channels per head."""
    vec = torch.zeros(h, d)
    idx = _channels(gen, h, d)
    vec.scatter_(1, idx, value_fn(idx.shape))
    return vec


def gaussian(b, h, s, d, dtype=torch.float32, device="cpu", seed=0) -> Tensors:
    """Q, K, V ~ N(0, 1), each (B, H, S, D)."""
    _check(b, h, s, d, dtype)
    _, q, k, v = _base(b, h, s, d, seed)
    return _finish(q, k, v, dtype, device)


def _channel_outliers(target: str):
    def gen_fn(b, h, s, d, dtype=torch.float32, device="cpu", seed=0) -> Tensors:
        _check(b, h, s, d, dtype)
        gen, q, k, v = _base(b, h, s, d, seed)
        factor = _per_channel(gen, h, d, lambda shape: 10.0 + 10.0 * torch.rand(shape, generator=gen))
        factor = torch.where(factor == 0, torch.ones_like(factor), factor)[None, :, None, :]
        if target == "k":
            k = k * factor
        else:
            v = v * factor
        return _finish(q, k, v, dtype, device)
    gen_fn.__doc__ = (f"Gaussian with {OUTLIER_CHANNELS} channels of {target.upper()} per head scaled by "
                      "a factor in [10, 20]; (B, H, S, D) each.")
    return gen_fn


def _offset_vector(kind: str, gen, h: int, d: int) -> torch.Tensor:
    """(H, D) offset shared by every token: ``uniform``, ``sparse`` or ``direction``."""
    if kind == "uniform":
        return torch.full((h, d), UNIFORM_OFFSET)
    if kind == "sparse":
        return _per_channel(gen, h, d, lambda shape: torch.full(shape, SPARSE_OFFSET))
    u = torch.randn(h, d, generator=gen)
    return u / u.norm(dim=-1, keepdim=True) * (UNIFORM_OFFSET * math.sqrt(d))


def _offset(kind: str, target: str):
    def gen_fn(b, h, s, d, dtype=torch.float32, device="cpu", seed=0) -> Tensors:
        _check(b, h, s, d, dtype)
        gen, q, k, v = _base(b, h, s, d, seed)
        off = _offset_vector(kind, gen, h, d)[None, :, None, :]
        if "q" in target:
            q = q + off
        if "k" in target:
            k = k + off
        return _finish(q, k, v, dtype, device)
    gen_fn.__doc__ = f"Gaussian with a shared {kind} offset added to every token of {target.upper()}."
    return gen_fn


def sharp(b, h, s, d, dtype=torch.float32, device="cpu", seed=0) -> Tensors:
    """Gaussian with Q multiplied by 4 (scores x4); (B, H, S, D) each."""
    _check(b, h, s, d, dtype)
    _, q, k, v = _base(b, h, s, d, seed)
    return _finish(q * SHARP_FACTOR, k, v, dtype, device)


def position_features(s: int, d: int) -> torch.Tensor:
    """(S, D) features ``[cos(pos w_j), sin(pos w_j)]`` with ``w_j = S^(-j / (D/2 - 1))``, j < D/2.

    ``phi(i) . phi(j) = sum_j cos((i - j) w_j)``: D/2 at distance 0, decaying with distance.
    """
    half = max(1, d // 2)
    expo = torch.arange(half, dtype=torch.float64) / max(1, half - 1)
    freqs = float(s) ** (-expo)
    angle = torch.arange(s, dtype=torch.float64)[:, None] * freqs[None, :]
    feat = torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)
    if feat.shape[1] < d:
        feat = torch.cat([feat, torch.zeros(s, d - feat.shape[1], dtype=torch.float64)], dim=-1)
    return feat.float()


def locality(b, h, s, d, dtype=torch.float32, device="cpu", seed=0) -> Tensors:
    """Gaussian plus the RoPE-like position component :func:`position_features` on Q and K."""
    _check(b, h, s, d, dtype)
    _, q, k, v = _base(b, h, s, d, seed)
    phi = position_features(s, d)[None, None]
    return _finish(q + phi, k + phi, v, dtype, device)


def attention_sink(b, h, s, d, dtype=torch.float32, device="cpu", seed=0) -> Tensors:
    """Gaussian with key 0 a sink: ``k_0 = s_norm u``, ``q += 4 u`` (u a unit vector per head).

    ``s_norm = (ln(S) + 4) sqrt(D) / 4`` so the sink's mean score is ``ln(S) + 4`` nats: on average
    most of every row's mass falls on key 0.
    """
    _check(b, h, s, d, dtype)
    gen, q, k, v = _base(b, h, s, d, seed)
    u = torch.randn(h, d, generator=gen)
    u = u / u.norm(dim=-1, keepdim=True)
    norm = (math.log(s) + SINK_MARGIN) * math.sqrt(d) / SINK_QUERY_SHIFT
    q = q + SINK_QUERY_SHIFT * u[None, :, None, :]
    k = k.clone()
    k[:, :, 0, :] = norm * u[None, :, :]
    return _finish(q, k, v, dtype, device)


def clustered(b, h, s, d, dtype=torch.float32, device="cpu", seed=0) -> Tensors:
    """Patch-like tokens: each token belongs to one of :data:`CLUSTERS` centres per head (the same one for its q, k
    and v); q and k are the centre plus N(0, CLUSTER_QK_SPREAD^2) noise, times CLUSTER_QK_SCALE; v is its own
    centre plus N(0, CLUSTER_V_SPREAD^2) noise. Rows attend sharply to the tokens of their cluster, as the patch
    tokens of a trained vision transformer do, and the quantized recipes' error is small (~1%), so a kernel's
    own deviation from its reference stands out here. (B, H, S, D) each."""
    _check(b, h, s, d, dtype)
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    centres_qk = torch.randn(h, CLUSTERS, d, generator=gen)
    centres_v = torch.randn(h, CLUSTERS, d, generator=gen)
    member = torch.randint(0, CLUSTERS, (b, h, s), generator=gen)
    heads = torch.arange(h)[None, :, None]
    base_qk, base_v = centres_qk[heads, member], centres_v[heads, member]  # (B, H, S, D)
    q = CLUSTER_QK_SCALE * (base_qk + CLUSTER_QK_SPREAD * torch.randn(b, h, s, d, generator=gen))
    k = CLUSTER_QK_SCALE * (base_qk + CLUSTER_QK_SPREAD * torch.randn(b, h, s, d, generator=gen))
    v = base_v + CLUSTER_V_SPREAD * torch.randn(b, h, s, d, generator=gen)
    return _finish(q, k, v, dtype, device)


FAMILIES: Dict[str, Generator] = {"gaussian": gaussian, "k_channel_outliers": _channel_outliers("k")}
for _kind in ("uniform", "sparse", "direction"):
    for _target in ("q", "k", "qk"):
        FAMILIES[f"offset_{_kind}_{_target}"] = _offset(_kind, _target)
FAMILIES.update(v_channel_outliers=_channel_outliers("v"), sharp=sharp, locality=locality,
                attention_sink=attention_sink, clustered=clustered)

_TARGET = {"q": "Q", "k": "K", "qk": "Q and K"}
DESCRIPTIONS: Dict[str, str] = {
    "gaussian": "Q, K, V ~ N(0, 1)",
    "k_channel_outliers": f"{OUTLIER_CHANNELS} K channels per head x10-20",
    "v_channel_outliers": f"{OUTLIER_CHANNELS} V channels per head x10-20",
    "sharp": "Q x4 (scores x4)",
    "locality": "RoPE-like cos/sin position component on Q and K",
    "attention_sink": "key 0 a sink every row attends to",
    "clustered": f"patch-like: tokens around {CLUSTERS} centres per head, sharp rows within a cluster",
}
for _target, _who in _TARGET.items():
    DESCRIPTIONS[f"offset_uniform_{_target}"] = f"+3 on every channel of {_who}"
    DESCRIPTIONS[f"offset_sparse_{_target}"] = f"+10 on {OUTLIER_CHANNELS} channels of {_who}"
    DESCRIPTIONS[f"offset_direction_{_target}"] = f"random direction, norm 3 sqrt(D), on {_who}"


def get_family(name: str) -> Generator:
    """The generator of family ``name``; ValueError listing the accepted names otherwise."""
    if name not in FAMILIES:
        raise ValueError(f"unknown input family {name!r}; accepted: {', '.join(FAMILIES)}")
    return FAMILIES[name]
