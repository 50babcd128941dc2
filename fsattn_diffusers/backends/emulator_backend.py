"""The PyTorch reference emulator as a backend: runs on any device, slowly."""

from __future__ import annotations

from .registry import Backend, register_backend


def _available(device):
    return None


def _unsupported(q, k, v, recipe, *, kv_lens, return_lse, q_lens=None):
    return None


def _run(q, k, v, recipe, *, scale, kv_lens, return_lse, return_stats, q_lens=None):
    from ..emulator import emulate_attention

    return emulate_attention(q, k, v, recipe, scale=scale, kv_lens=kv_lens, return_lse=return_lse,
                             return_stats=return_stats, q_lens=q_lens)


register_backend(Backend("emulator", _run, _available, _unsupported, slow=True, takes_q_lens=True))
