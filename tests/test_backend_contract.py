"""The backend contract and registration by hardware target: every registered backend takes one AttentionRequest and
returns one AttentionResult; the Hopper kernels take compute capability 9.0 only, so a faked sm_100 device is offered
none of them, ``auto`` picks the next backend and ``fsattn info`` says why (CPU only: the capability is faked)."""

import inspect
import sys
import types
import typing

import pytest
import torch

from fsattn_diffusers.backends import (AttentionRequest, AttentionResult, SpeedClass, auto_order, availability,
                                       fast_path, pick, registered)
from fsattn_diffusers.backends.registry import forget_devices
from fsattn_diffusers.recipe import PRESETS

CUDA0 = torch.device("cuda", 0)
HOPPER_REFUSAL = "Hopper kernels need compute capability 9.0 (sm_90); this device is 10.0"


@pytest.fixture
def fake_capability(monkeypatch):
    """``set(major, minor)`` fakes the capability every device rule reads; remembered probes are dropped around it."""
    def set_capability(cap):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
        forget_devices()

    registered()
    yield set_capability
    forget_devices()


def _request(recipe="mxfp8", dtype=torch.float32, **kw):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 64, generator=g).to(dtype) for _ in range(3))
    return AttentionRequest(q, k, v, PRESETS[recipe] if isinstance(recipe, str) else recipe, 0.125, **kw)


def test_a_faked_sm100_device_is_offered_no_hopper_kernel_and_auto_picks_the_next(fake_capability, monkeypatch):
    fake_capability((10, 0))
    usable = availability(CUDA0)
    print(usable)
    assert usable["triton"] == HOPPER_REFUSAL and usable["emulator"] is None
    assert [n for n, why in usable.items() if why is None and registered()[n].computes == "sm90"] == []
    name, speed = fast_path(PRESETS["mxfp8"], CUDA0)
    assert (name, speed.speed_class) == ("emulator", SpeedClass.REFERENCE)
    chosen, notable = pick("auto", _request(), device=CUDA0)
    assert chosen.name == "emulator" and notable == []  # absent backends are passed over silently under auto
    chosen, notable = pick("triton", _request(), device=CUDA0)
    assert chosen.name == "emulator" and notable == [f"triton: {HOPPER_REFUSAL}"]
    fake_capability((9, 0))  # the same query on a Hopper GPU offers the Hopper kernels (triton faked where absent)
    monkeypatch.setitem(sys.modules, "triton", sys.modules.get("triton") or types.ModuleType("triton"))
    assert availability(CUDA0)["triton"] is None and fast_path(PRESETS["mxfp8"], CUDA0)[0] == "triton"
    assert fast_path(PRESETS["mxfp4"], CUDA0)[1].speed_class == SpeedClass.WIDENED


def test_fsattn_info_says_why_a_faked_sm100_device_gets_no_hopper_kernel(fake_capability, monkeypatch, capsys):
    from fsattn_diffusers import cli
    from fsattn_diffusers.commands import info

    fake_capability((10, 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "Faked B200")
    monkeypatch.setattr(cli, "usable_device", lambda text: torch.device(text, 0))
    monkeypatch.setattr(info, "_version", lambda mod, must_import: "faked")
    assert info.run(cli.build_parser().parse_args(["info", "--device", "cuda"])) == 0
    out = capsys.readouterr().out
    print(out)
    lines = {ln.split()[0]: ln.strip() for ln in out.splitlines() if ln.startswith("  ")}
    assert "Faked B200 (sm_100)" in lines["cuda:0"]
    assert lines["triton"] == f"triton    not usable: {HOPPER_REFUSAL}"
    assert lines["auto"].endswith(": emulator here") and lines["auto"].startswith(f"auto      tries {auto_order()[0]}")


def _contract_hints(fn):
    hints = typing.get_type_hints(fn)
    return hints.get("request"), hints.get("return")


def _runnable_here(name, monkeypatch):
    """The recipe and dtype ``name`` runs on the CPU (with the fake FA3 installed), or None for a GPU-only backend."""
    if name == "fa3":
        import fake_fa3

        fake_fa3.install(monkeypatch)
        from fsattn_diffusers.backends.fa3_backend import FA3_RECIPE

        return FA3_RECIPE, torch.bfloat16
    if registered()[name].available_on(torch.device("cpu")) is None:
        return PRESETS["mxfp8"], torch.float32
    return None


@pytest.mark.parametrize("name", sorted(registered()))
def test_every_backend_takes_the_request_and_returns_the_result(name, monkeypatch):
    be = registered()[name]
    for fn in (be.run, be.refuses):
        params = list(inspect.signature(fn).parameters.values())
        assert len(params) == 1 and params[0].kind is params[0].POSITIONAL_OR_KEYWORD, (name, fn, params)
    request_type, result_type = _contract_hints(be.run)
    assert request_type is AttentionRequest and result_type is AttentionResult, (name, request_type, result_type)
    assert be.speed_for(PRESETS["mxfp8"]).speed_class in SpeedClass
    runnable = _runnable_here(name, monkeypatch)
    if runnable is None:
        pytest.skip(f"{name}: not runnable on the CPU ({be.available_on(torch.device('cpu'))}); signature checked")
    recipe, dtype = runnable
    be = registered()[name]  # the fake FA3 replaces the registration
    for asks in (dict(), dict(return_lse=True, return_stats=True, kv_lens=torch.tensor([33]))):
        req = _request(recipe, dtype, **asks)
        assert be.refuses(req) is None
        res = be.run(req)
        assert type(res) is AttentionResult and res.out.shape == req.q.shape and res.out.dtype == dtype
        assert (res.lse is not None) == req.return_lse and (res.stats is not None) == req.return_stats
        if res.lse is not None:
            assert res.lse.shape == req.q.shape[:3] and res.lse.dtype == torch.float32
        assert res.nonfinite is None  # not asked
