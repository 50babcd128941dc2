"""AITER's ``mha_v4`` (the paper's own MI355X kernels). Unverified on hardware: we have no MI355X."""

from __future__ import annotations

from . import Backend, register_backend


def _available(device):
    return "not ROCm (AITER mha_v4 needs an MI355X)"


def _unsupported(q, k, v, recipe, *, kv_lens, return_lse):
    return None


def _run(q, k, v, recipe, *, scale, kv_lens, return_lse, return_stats):
    raise RuntimeError("AITER is not available")


register_backend(Backend("aiter", _run, _available, _unsupported))
