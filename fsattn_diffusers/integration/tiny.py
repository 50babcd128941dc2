"""Tiny, fully offline pipelines with random weights (smoke models: their videos are noise-like).

* :func:`tiny_wan22_pipeline` — the default of ``fsattn generate``: Wan2.2-T2V architecture with
  both experts (``transformer``, ``transformer_2``) and a boundary ratio, a word-level tokenizer
  built locally with ``tokenizers``, a small random ``UMT5EncoderModel`` and a small
  ``AutoencoderKLWan``. Attention head dim 64, so MX blocks of 32 and the Hadamard rotation apply and
  every recipe runs its quantized path.
* :func:`tiny_hunyuan_video_pipeline` — HunyuanVideo architecture (dual- and single-stream blocks, a
  token refiner, Llama and CLIP text encoders), for tests of the HunyuanVideo path.

Weights come from a fixed seed inside a forked RNG, so building a pipeline does not disturb the
caller's random state and two builds are identical.
"""

from __future__ import annotations

import torch

#: Seed of the random weights (the first expert uses it, the second expert SEED + 1, ...).
SEED = 20250101
#: Attention head dim of the tiny transformers: a multiple of 32 (MX blocks) and a power of two.
HEAD_DIM = 64
HEADS = 2
#: Wan2.2 T2V A14B switches from the high-noise to the low-noise expert at t = 0.875 * 1000.
WAN22_BOUNDARY_RATIO = 0.875
#: Text width of the tiny Wan text encoder (= the transformer's ``text_dim``).
WAN_TEXT_DIM = 32
SMOKE_NOTE = ("the built-in model is a tiny random-weight smoke model: its video is noise-like and only "
              "shows that the pipeline runs; pass --model for a real checkpoint")

_WORDS = ("a an the of and in on at to with under over through near by from into his her its their is are "
          "cat dog fox bird fish horse robot person man woman child car boat train plane tree forest river "
          "sea ocean lake mountain city street road sky cloud rain snow sun moon star night day light "
          "red orange yellow green blue purple black white gray golden silver bright dark small big tall "
          "runs running walks walking flies flying swims swimming jumps dancing sits sitting looks "
          "slowly quickly camera pans zooms close up wide shot cinematic realistic video scene field "
          "grass flower water fire smoke wind wave beach desert castle house room window door table").split()
_SPECIALS = ("<pad>", "</s>", "<unk>", "<s>")


def _word_tokenizer():
    """A lowercase word-level tokenizer (``PreTrainedTokenizerFast``) built without any download."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(list(_SPECIALS) + list(_WORDS))}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   bos_token="<s>", padding_side="right")


def tiny_wan_transformer(seed: int = SEED, num_layers: int = 2):
    """A WanTransformer3DModel with 2 heads of dim 64 (model dim 128) and ``num_layers`` blocks."""
    from diffusers import WanTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
                                     in_channels=16, out_channels=16, text_dim=WAN_TEXT_DIM, freq_dim=256,
                                     ffn_dim=2 * HEADS * HEAD_DIM, num_layers=num_layers, cross_attn_norm=True,
                                     qk_norm="rms_norm_across_heads").eval()


def tiny_wan22_pipeline(seed: int = SEED, scheduler: str = "unipc"):
    """The embedded default: a tiny Wan2.2-architecture ``WanPipeline`` with two experts.

    Parameters
    ----------
    seed : int
        Seed of the random weights.
    scheduler : str
        ``"unipc"`` (UniPC with flow matching, as Wan2.2 ships) or ``"euler"``
        (FlowMatchEulerDiscreteScheduler).
    """
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = _word_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=len(tokenizer), d_model=WAN_TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)).eval()
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True]).eval()
    if scheduler == "unipc":
        sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                                        num_train_timesteps=1000)
    elif scheduler == "euler":
        sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    else:
        raise ValueError(f"unknown scheduler {scheduler!r}; accepted: unipc, euler")
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=sched,
                       transformer=tiny_wan_transformer(seed), transformer_2=tiny_wan_transformer(seed + 1),
                       boundary_ratio=WAN22_BOUNDARY_RATIO)


#: HunyuanVideo's prompt template markers, kept as single tokens of the tiny Llama tokenizer.
_HUNYUAN_MARKERS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
HUNYUAN_TEXT_DIM, HUNYUAN_POOLED_DIM = 16, 8


def _marker_tokenizer():
    """Word-level tokenizer that keeps HunyuanVideo's ``<|...|>`` template markers whole."""
    tokenizer = _word_tokenizer()
    tokenizer.backend_tokenizer.add_special_tokens(list(_HUNYUAN_MARKERS))
    return tokenizer


def tiny_hunyuan_transformer(seed: int = SEED):
    """HunyuanVideoTransformer3DModel: 2 heads of dim 64, one dual-, one single-stream block, one
    refiner block; text width 16, pooled text width 8, 4 latent channels, patch 1."""
    from diffusers import HunyuanVideoTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, num_layers=1,
            num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
            text_embed_dim=HUNYUAN_TEXT_DIM, pooled_projection_dim=HUNYUAN_POOLED_DIM,
            rope_axes_dim=(16, 24, 24)).eval()


def tiny_hunyuan_video_pipeline(seed: int = SEED):
    """A tiny ``HunyuanVideoPipeline`` (1 dual-stream, 1 single-stream block, head dim 64)."""
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    tokenizer, tokenizer_2 = _marker_tokenizer(), _word_tokenizer()
    transformer = tiny_hunyuan_transformer(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLHunyuanVideo(
            in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
            up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
            act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
            temporal_compression_ratio=4, mid_block_add_attention=True).eval()
        text_encoder = LlamaModel(LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=HUNYUAN_TEXT_DIM, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id)).eval()
        text_encoder_2 = CLIPTextModel(CLIPTextConfig(
            vocab_size=len(tokenizer_2), hidden_size=HUNYUAN_POOLED_DIM, intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=77, projection_dim=HUNYUAN_POOLED_DIM,
            pad_token_id=tokenizer_2.pad_token_id, bos_token_id=tokenizer_2.bos_token_id,
            eos_token_id=tokenizer_2.eos_token_id)).eval()
    return HunyuanVideoPipeline(text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                                text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2)
