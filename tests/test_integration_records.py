"""The recipe follows the denoising step: per-call records of full pipeline runs vs. the schedule.

Wan2.2 (two experts, boundary ratio, classifier-free guidance: two transformer calls per step, the
pipeline passes a step index) and HunyuanVideo (no step index; with and without true CFG).
"""


import pytest
import torch

import fsattn_diffusers
from fsattn_diffusers.integration.tiny import WAN22_BOUNDARY_RATIO, tiny_hunyuan_video_pipeline, tiny_wan22_pipeline

STEPS = 20
WAN_LAYERS = 2  # self-attention layers per tiny Wan expert
HUNYUAN_LAYERS = 2  # one dual-stream + one single-stream block


pytestmark = pytest.mark.usefixtures("quiet_slow_backend_warning")


@pytest.fixture(scope="module")
def wan():
    pipe = tiny_wan22_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _wan_run(pipe, steps, **kw):
    return pipe("a red fox in the snow", negative_prompt="blurry", height=32, width=32, num_frames=5,
                num_inference_steps=steps, guidance_scale=4.0, guidance_scale_2=3.0, output_type="latent",
                generator=torch.Generator().manual_seed(0), max_sequence_length=16, **kw).frames


def _check_against_plan(handle, timesteps, expected_model, calls_per_step):
    plan = handle.plan(len(timesteps))
    by_step = {}
    for r in handle.records:
        by_step.setdefault(r.step, []).append(r)
    assert sorted(by_step) == list(range(len(timesteps))), sorted(by_step)
    for i, t in enumerate(timesteps):
        recs = by_step[i]
        got = [(r.recipe, r.transformer, r.timestep) for r in recs]
        want = [(plan[i], expected_model(float(t)), float(t))] * calls_per_step
        assert got == want, (i, got, want)


def test_wan22_records_follow_steps_under_cfg_and_two_experts(wan):
    handle = fsattn_diffusers.apply(wan, policy="hybrid", backend="emulator")
    try:
        latents = _wan_run(wan, STEPS)
        timesteps = wan.scheduler.timesteps.clone()
    finally:
        fsattn_diffusers.remove(wan)
    print("\n".join(handle.summary()))
    boundary = WAN22_BOUNDARY_RATIO * wan.scheduler.config.num_train_timesteps
    expert = lambda t: "transformer" if t >= boundary else "transformer_2"  # noqa: E731
    assert {expert(float(t)) for t in timesteps} == {"transformer", "transformer_2"}  # both experts ran
    assert len(handle.records) == STEPS * 2 * WAN_LAYERS  # CFG: cond + uncond per layer per step
    _check_against_plan(handle, timesteps, expert, calls_per_step=2 * WAN_LAYERS)
    assert handle.plan(STEPS) == ["mxfp6"] * 3 + ["mxfp4"] * 14 + ["mxfp6"] * 3
    assert torch.isfinite(latents).all()


def test_wan_new_run_and_swapped_scheduler_are_followed(wan):
    from diffusers import FlowMatchEulerDiscreteScheduler

    original = wan.scheduler
    handle = fsattn_diffusers.apply(wan, policy="mxfp6:1,bf16:3,mxfp6:1", backend="emulator")
    try:
        _wan_run(wan, 20)
        _wan_run(wan, 10)  # a new run restarts the step count and rescales the schedule
        assert [r.recipe for r in handle.records[::2 * WAN_LAYERS]] == handle.plan(10)
        assert handle.plan(10) == ["mxfp6"] * 2 + ["bf16"] * 6 + ["mxfp6"] * 2
        wan.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)  # swapped after apply
        _wan_run(wan, 5)
        assert [r.step for r in handle.records[::2 * WAN_LAYERS]] == [0, 1, 2, 3, 4]
        assert [r.recipe for r in handle.records[::2 * WAN_LAYERS]] == handle.plan(5)
    finally:
        fsattn_diffusers.remove(wan)
        wan.scheduler = original
    assert "step" not in wan.scheduler.__dict__ and "set_timesteps" not in wan.scheduler.__dict__


@pytest.mark.parametrize("true_cfg", [False, True])
def test_hunyuan_records_follow_steps(true_cfg):
    pipe = tiny_hunyuan_video_pipeline()
    pipe.set_progress_bar_config(disable=True)
    handle = fsattn_diffusers.apply(pipe, policy="hybrid", backend="emulator")
    cfg = dict(negative_prompt="blurry", true_cfg_scale=2.0) if true_cfg else {}
    try:
        latents = pipe("a red fox in the snow", height=16, width=16, num_frames=1, num_inference_steps=STEPS,
                       output_type="latent", generator=torch.Generator().manual_seed(0), max_sequence_length=8,
                       **cfg).frames
        timesteps = pipe.scheduler.timesteps.clone()
    finally:
        fsattn_diffusers.remove(pipe)
    print("\n".join(handle.summary()))
    calls = (2 if true_cfg else 1) * HUNYUAN_LAYERS
    assert len(handle.records) == STEPS * calls
    _check_against_plan(handle, timesteps, lambda t: "transformer", calls_per_step=calls)
    assert torch.isfinite(latents).all()  # padded text (mask) on every call


def test_records_name_the_backend_that_ran(wan):
    handle = fsattn_diffusers.apply(wan, policy="bf16:1,mxfp8:1")  # backend "auto": the emulator on a CPU
    try:
        _wan_run(wan, 2)
    finally:
        fsattn_diffusers.remove(wan)
    by_step = {(r.step, r.recipe, r.backend) for r in handle.records}
    assert by_step == {(0, "bf16", "stock"), (1, "mxfp8", "emulator")}, by_step
