"""Attention processors for diffusers 0.42 that replace only the attention computation.

Everything around the attention call keeps the stock behaviour (projections, fused projections, QK
norms, RoPE, output projections). Calls the policy maps to ``bf16`` — and calls fsattn cannot take
(cross-attention, an unsupported head dim, context parallelism outside Wan, a mask that is not a
key-padding prefix) — run the stock processor itself, so their outputs are bit-identical to stock diffusers.

Targeting only self-attention with ``set_attn_processor``::

    from fsattn_diffusers.integration import WanFSAttnProcessor
    for name, module in pipe.transformer.named_modules():
        if name.endswith("attn1"):                      # Wan: attn1 = self-attention
            module.set_processor(WanFSAttnProcessor("mxfp8"))

:func:`fsattn_diffusers.apply` does this (and the step tracking schedules need) for a whole pipeline.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..api import attention, supported_head_dim
from ..backends import warn_once
from ..backends.rope import fused_rope
from ..recipe import Recipe
from ..smoothing import valid_prefix
from .policy import Entry, FixedPolicy, entry_name, get_policy
from .tracker import CallRecord, StepTracker, run_eagerly


def diffusers_backend_name(value) -> str:
    """``"diffusers:<name>"`` for a processor's ``_attention_backend`` (an ``AttentionBackendName``, a string, or
    None: diffusers' active backend, ``native`` unless set)."""
    if value is None:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        value = _AttentionBackendRegistry._active_backend
    return f"diffusers:{getattr(value, 'value', value)}"


class _FSAttnProcessorBase:
    """Policy, backend and step bookkeeping shared by the model-specific processors.

    Parameters
    ----------
    policy : str, Recipe, mapping or Policy
        See :func:`fsattn_diffusers.integration.policy.get_policy`. A policy that changes with the
        step needs ``tracker`` (``apply`` provides one).
    backend : str
        Passed to :func:`fsattn_diffusers.attention` (``"auto"``, ``"triton"``, ``"emulator"``, ...).
    tracker : StepTracker, optional
        Source of the denoising step and sink of the per-call records.
    layer : str, optional
        Name used in the records (e.g. ``"transformer.blocks.0.attn1"``).
    """

    # diffusers sets these on processors (attention backend, context parallelism).
    _attention_backend = None
    _parallel_config = None
    #: Self-attention runs under diffusers' ring / Ulysses templates when ``_parallel_config`` is set.
    _supports_context_parallel = False

    def __init__(self, policy="mxfp8", backend: str = "auto", tracker: Optional[StepTracker] = None,
                 layer: Optional[str] = None):
        run_eagerly(_FSAttnProcessorBase, "_choose_eager")
        self.policy = get_policy(policy)
        if tracker is None:
            if not self.policy.is_fixed:
                raise ValueError(f"policy {self.policy.name!r} changes with the denoising step and needs a "
                                 f"StepTracker; accepted: fsattn_diffusers.apply(pipe, policy=...) or "
                                 f"tracker=StepTracker() attached to the pipeline")
            tracker = StepTracker(record=False)
        if not isinstance(backend, str):
            raise ValueError(f"backend must be a string, got {type(backend).__name__}")
        # A baseline policy (fa3, fa3-fp8) names its own kernel; fsattn policies run on ``backend``.
        self.backend = self.policy.backend or backend
        self.tracker = tracker
        self.layer = layer

    def _stock(self):
        proc = self._stock_processor
        proc._attention_backend = self._attention_backend
        proc._parallel_config = self._parallel_config
        return proc

    def _choose(self, attn) -> Entry:
        """The entry for this call (``None`` = stock) after fallbacks, recorded in the tracker.

        Under ``torch.compile`` a fixed policy is resolved inside the graph (no step is read, so there is
        no graph break and no guard on step counters; such calls are not recorded); a policy that changes
        with the step runs :meth:`_choose_eager` outside the graph (one graph break per call).
        """
        if isinstance(self.policy, FixedPolicy) and torch.compiler.is_compiling():
            return self._fixed_entry(attn)
        return self._choose_eager(attn)

    def _fallback_note(self, attn, planned: Recipe) -> Optional[str]:
        """Why ``planned`` cannot run on this module (head dim, context parallelism), or ``None``."""
        note = supported_head_dim(planned, attn.inner_dim // attn.heads)
        if note is None and self._parallel_config is not None and not self._supports_context_parallel:
            note = f"context parallelism is not supported by {type(self).__name__}"
        return note

    def _fixed_entry(self, attn) -> Entry:
        planned = self.policy.entry
        return None if planned is None or self._fallback_note(attn, planned) is not None else planned

    # run_eagerly (from __init__): runs eagerly under torch.compile, guards see the entry, not step counters
    def _choose_eager(self, attn) -> Entry:
        step, num_steps = self.tracker.position()
        planned = self.policy.entry_at(step, num_steps)
        entry, note = planned, None
        if planned is not None:
            note = self._fallback_note(attn, planned)
            if note is not None:
                warn_once(f"integration:{type(self).__name__}:{note}",
                          f"fsattn: using stock attention instead ({note})")
                entry = None
        self._record(step, num_steps, entry, planned, note)
        return entry

    def _record(self, step, num_steps, entry, planned, note) -> None:
        if self.tracker.record:
            ran, wanted, backend = entry_name(entry), entry_name(planned), "stock" if entry is None else self.backend
            chosen = getattr(self.policy, "attention_backend", None)
            if chosen is not None:  # a diffusers backend (sage): what this processor's calls are dispatched to
                wanted, backend = self.policy.name, diffusers_backend_name(self._attention_backend)
                ran = wanted if backend == f"diffusers:{chosen}" else "bf16"
                if ran != wanted:
                    note = f"diffusers attention backend is {backend}, not {chosen}"
            self.tracker.add(CallRecord(step, num_steps, self.tracker.timestep, self.tracker.transformer,
                                        self.layer, ran, wanted, backend, note))

    def _attend(self, q, k, v, entry, kv_lens=None, q_lens=None):
        """fsattn attention on (B, S, H, D) operands; output (B, S, H*D) in q's dtype. ``q_lens``: the valid queries
        (Q smoothing's mean counts only those)."""
        if self._parallel_config is not None and kv_lens is None:  # this rank's sequence shard
            from .context_parallel import context_parallel_attention

            out = context_parallel_attention(q, k, v, entry, self._parallel_config, backend=self.backend)
            self.tracker.ran_on(entry)
            return out.flatten(2, 3).to(q.dtype)
        out = attention(q, k, v, entry, layout="bshd", kv_lens=kv_lens, q_lens=q_lens, backend=self.backend)
        self.tracker.ran_on(entry)
        return out.flatten(2, 3).to(q.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(policy={self.policy.name!r}, backend={self.backend!r})"


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`_rope_interleaved`, by the fused Triton pass where it takes the operands (:mod:`..backends.rope`)."""
    fused = fused_rope(x, cos, sin)
    return _rope_interleaved(x, cos, sin) if fused is None else fused


def _rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's RoPE on (B, S, H, D): rotates interleaved pairs (x[2i], x[2i+1]) by the given angles."""
    pairs = x.unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    c, s = cos[..., 0::2], sin[..., 1::2]
    rotated = torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)
    return rotated.type_as(x)


class WanFSAttnProcessor(_FSAttnProcessorBase):
    """fsattn for the self-attention of ``WanAttention`` (Wan2.1 and Wan2.2 transformers).

    Cross-attention calls (with ``encoder_hidden_states``), masked calls and the image-to-video
    branch run the stock ``WanAttnProcessor`` unchanged and are not recorded. Under diffusers'
    context parallelism (``_parallel_config``) self-attention runs through diffusers' ring / Ulysses
    templates with fsattn as the local kernel (:mod:`fsattn_diffusers.integration.context_parallel`).
    """

    _supports_context_parallel = True

    def __init__(self, policy="mxfp8", backend: str = "auto", tracker: Optional[StepTracker] = None,
                 layer: Optional[str] = None):
        super().__init__(policy, backend, tracker, layer)
        from diffusers.models.transformers.transformer_wan import WanAttnProcessor

        self._stock_processor = WanAttnProcessor()

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None,
                 rotary_emb: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        stock_only = encoder_hidden_states is not None or attention_mask is not None or attn.add_k_proj is not None
        entry = None if stock_only else self._choose(attn)
        if entry is None:
            return self._stock()(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)

        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query, key = attn.norm_q(query), attn.norm_k(key)  # RMSNorm across heads, before the split
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        if rotary_emb is not None:
            query = _rope(query, *rotary_emb)
            key = _rope(key, *rotary_emb)

        out = self._attend(query, key, value, entry)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


def _heads_qkv(attn, states: torch.Tensor, projections, norms):
    """Query, key and value of ``states`` (B, S, C) through the three ``projections``, split into ``attn.heads`` heads
    (B, S, H, D); the two ``norms`` (None: none) applied per head to the query and the key."""
    query, key, value = (proj(states).unflatten(2, (attn.heads, -1)) for proj in projections)
    norm_q, norm_k = norms
    return (query if norm_q is None else norm_q(query)), (key if norm_k is None else norm_k(key)), value


def key_padding_lengths(mask: Optional[torch.Tensor], batch: int, n_keys: int):
    """Valid-key counts from a bool mask ``[B, 1, 1, N]`` that is True on a prefix of the keys.

    Returns
    -------
    (lens, ok)
        ``lens`` an int64 tensor (B,) or ``None`` when every key is valid; ``ok`` False when the mask
        is not such a key-padding prefix (the caller must then use stock attention). While
        ``torch.compile`` traces, the mask is taken to be a prefix and ``lens`` is always a tensor.
    """
    if mask is None:
        return None, True
    if mask.dtype != torch.bool or mask.dim() != 4 or tuple(mask.shape[1:]) != (1, 1, n_keys) or \
            mask.shape[0] not in (1, batch):
        return None, False
    keep = mask[:, 0, 0, :].expand(batch, n_keys)
    lens = keep.sum(dim=-1)
    if torch.compiler.is_compiling():
        # Inside a torch.compile graph the prefix test (data-dependent) is skipped: HunyuanVideo's transformer
        # builds this mask from the valid-token count, a prefix by construction; the lengths carry all of it.
        return lens.to(torch.int64), True
    if not torch.equal(keep, valid_prefix(lens, n_keys, mask.device)):
        return None, False
    if bool((lens == n_keys).all()):
        return None, True
    return lens.to(torch.int64), True


class HunyuanVideoFSAttnProcessor(_FSAttnProcessorBase):
    """fsattn for HunyuanVideo's joint image+text attention (dual- and single-stream blocks).

    The bool mask ``[B, 1, 1, N]`` becomes per-batch ``kv_lens``; padded keys are also zeroed before
    quantization so that their values cannot reach any shared scale. A mask that is not a key-padding
    prefix runs stock attention (one warning). Calls without text tokens and without RoPE — the token
    refiner's self-attention — run diffusers' ``AttnProcessor2_0`` (the refiner's stock processor),
    so ``transformer.set_attn_processor(HunyuanVideoFSAttnProcessor(...))`` on the whole model is safe.
    """

    def __init__(self, policy="mxfp8", backend: str = "auto", tracker: Optional[StepTracker] = None,
                 layer: Optional[str] = None):
        super().__init__(policy, backend, tracker, layer)
        from diffusers.models.attention_processor import AttnProcessor2_0
        from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

        self._stock_processor = HunyuanVideoAttnProcessor2_0()
        self._refiner_processor = AttnProcessor2_0()

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None,
                 image_rotary_emb: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
        if encoder_hidden_states is None:
            if image_rotary_emb is None:
                return self._refiner_processor(attn, hidden_states, None, attention_mask)
            return self._stock()(attn, hidden_states, None, attention_mask, image_rotary_emb)
        entry = self._choose(attn)
        if entry is not None:
            n_keys = hidden_states.shape[1] + encoder_hidden_states.shape[1]
            kv_lens, ok = key_padding_lengths(attention_mask, hidden_states.shape[0], n_keys)
            if not ok:
                warn_once("integration:hunyuan:mask", "fsattn: HunyuanVideo attention mask is not a key-padding "
                          "prefix; using stock attention for such calls")
                self._replace_last_record("mask is not a key-padding prefix")
                entry = None
        if entry is None:
            return self._stock()(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        return self._joint(attn, hidden_states, encoder_hidden_states, image_rotary_emb, entry, kv_lens)

    def _replace_last_record(self, note: str) -> None:
        if self.tracker.record and self.tracker.records:
            self.tracker.records[-1] = self.tracker.records[-1]._replace(recipe="bf16", backend="stock", note=note)

    def _joint(self, attn, hidden_states, encoder_hidden_states, image_rotary_emb, entry, kv_lens):
        from diffusers.models.embeddings import apply_rotary_emb

        n_text = encoder_hidden_states.shape[1]
        single_stream = attn.add_q_proj is None
        if single_stream:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        query, key, value = _heads_qkv(attn, hidden_states, (attn.to_q, attn.to_k, attn.to_v),
                                       (attn.norm_q, attn.norm_k))
        if image_rotary_emb is not None:  # RoPE on the image tokens only
            n_img = query.shape[1] - n_text if single_stream else query.shape[1]
            query = torch.cat([apply_rotary_emb(query[:, :n_img], image_rotary_emb, sequence_dim=1),
                               query[:, n_img:]], dim=1)
            key = torch.cat([apply_rotary_emb(key[:, :n_img], image_rotary_emb, sequence_dim=1),
                             key[:, n_img:]], dim=1)
        if not single_stream:
            enc_q, enc_k, enc_v = _heads_qkv(attn, encoder_hidden_states,
                                             (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj),
                                             (attn.norm_added_q, attn.norm_added_k))
            query, key, value = (torch.cat(p, dim=1) for p in ((query, enc_q), (key, enc_k), (value, enc_v)))

        if kv_lens is not None:  # padded keys: excluded by kv_lens, zeroed so no scale sees them
            valid = valid_prefix(kv_lens, key.shape[1], key.device)[:, :, None, None]
            key, value = torch.where(valid, key, 0.0), torch.where(valid, value, 0.0)
        # one joint sequence: its padded text tokens are padded queries as well (their outputs are not used)
        out = self._attend(query, key, value, entry, kv_lens=kv_lens, q_lens=kv_lens)

        out, enc_out = out[:, :-n_text], out[:, -n_text:]
        if getattr(attn, "to_out", None) is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        if getattr(attn, "to_add_out", None) is not None:
            enc_out = attn.to_add_out(enc_out)
        return out, enc_out
