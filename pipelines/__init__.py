"""Ready runners with the paper's settings for users with the weights.

* ``python -m fsattn_diffusers.pipelines.wan22_t2v_a14b --prompt "..."`` — Wan2.2-T2V-A14B, paper Section 5
  settings (81 frames 1280x720, 20 steps, guidance 4 / 3, UniPC with flow shift 12), hybrid policy.
* ``python -m fsattn_diffusers.pipelines.wan21_t2v --prompt "..."`` — Wan2.1-T2V-1.3B.
* ``python -m fsattn_diffusers.pipelines.hunyuan_video --prompt "..."`` — HunyuanVideo defaults.
* ``torchrun --nproc_per_node N -m fsattn_diffusers.pipelines.xdit_video --model Wan2.2-T2V --ulysses_degree N
  --policy hybrid ...`` — Wan2.2 / HunyuanVideo through xDiT (Ulysses / ring) with fsattn as the kernel.

:mod:`.settings` holds the settings (``RunSettings``) that ``fsattn generate --model`` also uses.
"""
