"""Which SageAttention is imported (:mod:`fsattn_diffusers.integration.sage`), from the module itself, with
CPU stand-ins of SageAttention 2 (sm90 build) and 1.0.6 written as real packages (``fake_sage``)."""

import os

import torch

import fake_sage
from fsattn_diffusers.integration import sage as sb


def test_sage2_build_is_named_with_its_path_version_and_sm90_kernel(monkeypatch, tmp_path):
    fake_sage.install(monkeypatch, tmp_path / "build", kind="2", dist_version="2.2.0+d1a57a5")
    ident = sb.sage_identity()
    print(ident["label"])
    assert ident["kind"] == "SageAttention 2" and ident["version"] == "2.2.0+d1a57a5"
    assert ident["sm90_entry"] and ident["sm90_kernels"] and not ident["metadata_mismatch"]
    assert ident["path"] == os.path.join(str(tmp_path / "build"), "sageattention", "__init__.py")
    assert "sageattn_qk_int8_pv_fp8_cuda_sm90: INT8 Q/K, FP8 P/V" in ident["label"]
    assert sb.sage_missing() is None and sb.require_sage("x") == ident


def test_pypi_106_beside_a_source_build_does_not_misname_it(monkeypatch, tmp_path):
    """A source build without metadata on the path first, PyPI's 1.0.6 (package and metadata) after it:
    importlib.metadata says 1.0.6, the imported module is SageAttention 2."""
    site = tmp_path / "site-packages"
    fake_sage.write_package(site, kind="1", dist_version="1.0.6")
    monkeypatch.syspath_prepend(str(site))
    fake_sage.install(monkeypatch, tmp_path / "build", kind="2", dist_version=None)
    ident = sb.sage_identity()
    print(ident["label"])
    assert ident["kind"] == "SageAttention 2" and ident["sm90_kernels"]
    assert ident["version"] is None and ident["metadata_version"] == "1.0.6"
    assert ident["metadata_path"] == str(site) and ident["metadata_mismatch"]
    assert "importlib.metadata reports sageattention 1.0.6" in ident["label"] and "not the imported module" in \
        ident["label"]


def test_sage2_metadata_beside_the_build_wins_over_an_older_one_later_on_the_path(monkeypatch, tmp_path):
    site = tmp_path / "site-packages"
    fake_sage.write_dist(site, "1.0.6")
    monkeypatch.syspath_prepend(str(site))
    fake_sage.install(monkeypatch, tmp_path / "build", kind="2", dist_version="2.2.0+d1a57a5")
    ident = sb.sage_identity()
    assert ident["version"] == ident["metadata_version"] == "2.2.0+d1a57a5" and not ident["metadata_mismatch"]


def test_pypi_106_is_named_as_such(monkeypatch, tmp_path):
    fake_sage.install(monkeypatch, tmp_path, kind="1", dist_version="1.0.6")
    ident = sb.sage_identity()
    print(ident["label"])
    assert (ident["kind"], ident["version"], ident["sm90_entry"], ident["sm90_kernels"]) == \
        ("SageAttention 1", "1.0.6", False, False)
    assert "Triton kernels" in ident["label"]
    q, k, v = (torch.randn(1, 2, 16, 32) for _ in range(3))
    out = sb.sage_call(q, k, v, 0.1)  # 1.0.6 has no return_lse: the call passes none
    ref = torch.softmax(q @ k.transpose(-1, -2) * 0.1, -1) @ v
    torch.testing.assert_close(out, ref)
    (call,) = __import__("sageattention").CALLS
    assert call["tensor_layout"] == "HND" and call["sm_scale"] == 0.1 and "return_lse" not in call


def test_missing_package_is_one_line_with_how_to_install(monkeypatch):
    fake_sage.hide(monkeypatch)
    why = sb.sage_missing()
    print(why)
    assert sb.sage_identity() is None and "\n" not in why
    assert "pip install sageattention (1.0.6, Triton) or build SageAttention 2 from source for Hopper" in why
    assert "needs an NVIDIA GPU" in why
    try:
        sb.require_sage("the sage policy")
    except ValueError as exc:
        assert str(exc).startswith("the sage policy needs SageAttention: sageattention is not importable")
    else:
        raise AssertionError("require_sage did not raise")
