"""Run settings of the models we ship runners for (paper settings where the paper gives them)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

#: Wan's default negative prompt (``sample_neg_prompt`` of the Wan2.x configs).
WAN_NEGATIVE_PROMPT = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，"
                       "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，"
                       "形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走")


@dataclass(frozen=True)
class RunSettings:
    """Everything a run needs besides the prompt, seed and policy.

    ``guidance_scale_2`` is Wan2.2's low-noise-expert guidance (for HunyuanVideo: the true-CFG scale
    used only with a negative prompt). ``flow_shift`` with ``scheduler="unipc"`` replaces the
    checkpoint's scheduler by UniPC (flow prediction) with that shift; ``None`` keeps the shipped one.
    """

    name: str
    hub_id: Optional[str]
    height: int
    width: int
    num_frames: int
    steps: int
    guidance_scale: float
    guidance_scale_2: Optional[float] = None
    scheduler: Optional[str] = None
    flow_shift: Optional[float] = None
    fps: int = 16
    negative_prompt: str = ""
    source: str = ""

    def with_overrides(self, **changes) -> "RunSettings":
        """Copy with the non-None ``changes`` applied."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


#: Paper Section 5: Wan2.2-T2V-A14B, 81 frames at 1280x720, 20 steps, guidance 4 / 3, shift 12, UniPC.
WAN22_T2V_A14B = RunSettings("wan2.2-t2v-a14b", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", 720, 1280, 81, 20, 4.0, 3.0,
                             scheduler="unipc", flow_shift=12.0, fps=16, negative_prompt=WAN_NEGATIVE_PROMPT,
                             source="paper Section 5")
#: Wan2.1-T2V-1.3B with diffusers' example settings (480p, 50 steps, guidance 5, shift 3).
WAN21_T2V_1_3B = RunSettings("wan2.1-t2v-1.3b", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", 480, 832, 81, 50, 5.0,
                             scheduler="unipc", flow_shift=3.0, fps=16, negative_prompt=WAN_NEGATIVE_PROMPT,
                             source="diffusers Wan example")
#: HunyuanVideo with HunyuanVideoPipeline's defaults (720p, 129 frames, 50 steps, embedded guidance 6).
HUNYUAN_VIDEO = RunSettings("hunyuanvideo", "hunyuanvideo-community/HunyuanVideo", 720, 1280, 129, 50, 6.0,
                            fps=24, source="diffusers HunyuanVideoPipeline defaults")
#: The embedded smoke model of ``fsattn generate`` (tiny, random weights).
TINY_WAN22 = RunSettings("tiny-wan2.2 (smoke model)", None, 128, 128, 17, 20, 4.0, 3.0, fps=8,
                         source="fsattn smoke test")


def settings_for(pipe) -> RunSettings:
    """Default settings for a loaded pipeline: Wan2.2 (two experts), Wan2.1 or HunyuanVideo."""
    name = type(pipe).__name__
    if name == "HunyuanVideoPipeline":
        return HUNYUAN_VIDEO
    if name == "WanPipeline":
        return WAN22_T2V_A14B if getattr(pipe, "transformer_2", None) is not None else WAN21_T2V_1_3B
    raise ValueError(f"no run settings for {name}; accepted: WanPipeline, HunyuanVideoPipeline")


def configure_scheduler(pipe, settings: RunSettings) -> None:
    """Install the settings' scheduler (UniPC with flow prediction and ``flow_shift``) if it names one."""
    if settings.scheduler is None:
        return
    if settings.scheduler != "unipc":
        raise ValueError(f"unknown scheduler {settings.scheduler!r}; accepted: unipc")
    from diffusers import UniPCMultistepScheduler

    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, prediction_type="flow_prediction",
                                                         use_flow_sigmas=True, flow_shift=settings.flow_shift)
