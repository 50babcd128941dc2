"""Both attention kernels compile offline for sm_90a (Triton's bundled ptxas; no GPU) in every configuration of
:mod:`fsattn_diffusers.measure.kernel_sass`, within the register file, without spills (``SPILLS_OUTSIDE_LOOPS``:
none inside a key loop) and without ptxas serializing the wgmma instructions (C7513; ``SERIALIZED_WGMMA_KNOWN``:
those it does serialize); with FP8 P the INT8 kernel's Stage-A one FMA in every copy (``stage_a_rounded_products``)."""

import pytest

pytest.importorskip("triton")
kernel_sass = pytest.importorskip("fsattn_diffusers.measure.kernel_sass")


@pytest.mark.parametrize("name", list(kernel_sass.CONFIGS))
def test_kernel_compiles_for_sm90a_without_spills(name):
    fn, kwargs = kernel_sass.CONFIGS[name]
    kernel = fn(**kwargs)
    info = kernel_sass.ptxas_info(kernel)  # one ptxas run for the registers, spills and serialization
    regs, spills = kernel_sass.register_use(kernel, info)
    sass = kernel_sass.sass_text(kernel)
    loops = kernel_sass.loops(sass)
    in_loops = kernel_sass.local_memory_in_loops(sass)
    print(f"{name}: registers {regs}, spill-store bytes {spills}, local-memory instructions in key loops {in_loops}, "
          f"shared {kernel.metadata.shared} B, key loops {[sum(body.values()) for _, body, _ in loops]} instructions")
    assert regs and max(regs) <= 255
    serialized = kernel_sass.serialized_wgmma(kernel, info)
    print(f"{name}: ptxas serializes the wgmma instructions (C7513): {serialized}")
    assert serialized == (name in kernel_sass.SERIALIZED_WGMMA_KNOWN)
    if name in kernel_sass.SPILLS_OUTSIDE_LOOPS:
        assert in_loops == 0
    else:
        assert spills and max(spills) == 0
    assert kernel.metadata.shared <= 227 * 1024  # an H100/H200 SM's shared memory per block
    assert loops, "no key loop (a backward branch around the tensor-core GEMMs) in the SASS"
    if name.startswith("gluon_int8"):  # FP8 P: Stage-A one FMA of the biased scores in every copy, as modelled
        rounded, total = kernel_sass.stage_a_rounded_products(sass)
        print(f"{name}: {rounded} of {total} Stage-A results an FADD of an FMUL (the product rounded first)")
        assert total
        if name.startswith("gluon_int8_fp8"):  # BF16 P keeps `x a - k` (the kernel's module docstring)
            assert rounded == 0



def test_the_key_count_is_never_a_compile_time_constant():
    # S_k == 1 compiled as a constant gave NaN / varying outputs on the H200 (see kernels/sm90/fused_attention.py).
    from fsattn_diffusers.kernels.sm90.fused_attention import fsattn_fwd_kernel

    params = {p.name: p for p in getattr(fsattn_fwd_kernel, "params", [])}
    if not params:
        pytest.skip("Triton's interpreter: no specialization")
    assert params["SK"].do_not_specialize
    assert not params["SQP"].do_not_specialize  # the rest keep Triton's specialization
    from fsattn_diffusers.kernels.sm90.fused_attention_gluon_int8 import fsattn_fwd_gluon_int8_kernel

    params = {p.name: p for p in fsattn_fwd_gluon_int8_kernel.params}
    assert params["SK"].do_not_specialize and not params["SQP"].do_not_specialize


@pytest.mark.parametrize("switched,plain", [("gluon_pingpong_smooth_q_sel_off", "gluon_pingpong"),
                                            ("gluon_pingpong_smooth_q_sel", "gluon_pingpong_smooth_q"),
                                            ("gluon_int8_smooth_q_sel_off", "gluon_int8"),
                                            ("gluon_int8_smooth_q_sel", "gluon_int8_smooth_q"),
                                            ("gluon_int8_exact_smooth_q_sel_off", "gluon_int8_exact"),
                                            ("gluon_int8_exact_smooth_q_sel", "gluon_int8_exact_smooth_q"),
                                            ("gluon_int8_fp8_smooth_q_sel_off", "gluon_int8_fp8")])
def test_the_q_smoothing_switch_keeps_each_key_loop_as_it_is(switched, plain):
    """Q smoothing's per-slice switch launches gluon_pingpong (and the INT8 kernel) once per setting with a per-program
    early return (``TERM_SEL``): its key loops must hold the single-setting kernel's instructions (counts per opcode;
    the order may differ, and with it the speed: docs/design.md, "The accurate tier")."""
    counts = {}
    for name in (switched, plain):
        fn, kwargs = kernel_sass.CONFIGS[name]
        counts[name] = [dict(body) for _, body, _ in kernel_sass.loops(kernel_sass.sass_text(fn(**kwargs)))]
    print({n: [sum(c.values()) for c in v] for n, v in counts.items()}, counts)
    # ptxas picks among integer moves and adds (MOV / IMAD.MOV, IADD3 / VIADD / IMAD) per build: one class for them,
    # every other opcode and the total must match
    merge = {"MOV": "int", "IMAD": "int", "IADD3": "int", "VIADD": "int"}

    def classes(body):
        out = {}
        for op, n in body.items():
            out[merge.get(op, op)] = out.get(merge.get(op, op), 0) + n
        return out

    assert [classes(b) for b in counts[switched]] == [classes(b) for b in counts[plain]]


@pytest.mark.parametrize("name", ["gluon_pingpong_smooth_q", "gluon_pingpong_mxfp6_smooth_q"])
def test_the_key_term_is_summed_before_the_scores_are_chained_on_it(name):
    """Q smoothing's K = 32 term wgmma starts from a zero accumulator and the score GEMM is chained on its result
    (why: kernels/sm90/fused_attention_gluon_pingpong.py, ``_issue_scores``; the other order left four H200 fuzz cases
    2.0-2.6% from the sm90 reference). Only the IR shows the order: the SASS of both has the same opcodes."""
    import re

    fn, kwargs = kernel_sass.CONFIGS[name]
    ttgir = fn(**kwargs).asm["ttgir"]
    dot = re.compile(r"(%[\w.]+) = ttng\.warp_group_dot %[\w.]+, %[\w.]+, (%[\w.]+), %(true|false) .*?: "
                     r"!ttg\.memdesc<(\d+)x(\d+)xf8E4M3FN")
    dots = [m.groups() for m in dot.finditer(ttgir)]  # (result, accumulator, use_acc, A rows, A cols) from shared
    terms = [i for i, d in enumerate(dots) if d[4] == "32"]
    print(f"{name}: {len(dots)} shared-memory FP8 dots, key-term dots at {terms}")
    assert terms, "no K = 32 key-term wgmma in the IR"
    for i in terms:
        result, _, use_acc, _, _ = dots[i]
        assert use_acc == "false", f"the key term accumulates onto {dots[i][1]}"
        assert i + 1 < len(dots) and dots[i + 1][1] == result and dots[i + 1][2] == "true" and dots[i + 1][4] != "32", \
            f"the score GEMM after the key term is not chained on it: {dots[i + 1:i + 2]}"


@pytest.mark.parametrize("kernel,const", [
    ("_int8_qk_kernel", dict(PER_ROW=True, HAS_MEAN=False, HAS_KVL=False, HAS_FLAGS=True, DOT_F32=False)),
    ("_int8_qk_kernel", dict(PER_ROW=False, HAS_MEAN=True, HAS_KVL=True, HAS_FLAGS=True, DOT_F32=False)),
    ("_int8_qk_kernel", dict(PER_ROW=False, HAS_MEAN=True, HAS_KVL=True, HAS_FLAGS=True, DOT_F32=False,
                             HAS_BIAS=True)),
    ("_v_bf16_kernel", dict(HAS_KVL=True, HAS_FLAGS=True))])
def test_the_int8_pre_pass_compiles_for_sm90a_without_spills(kernel, const):
    import triton
    from triton.compiler import ASTSource

    from fsattn_diffusers.kernels.sm90 import prepass_int8

    fn = getattr(prepass_int8, kernel)
    types = dict(kernel_sass.TYPES, X="*bf16", V="*bf16", OUT="*i8" if kernel == "_int8_qk_kernel" else "*bf16",
                 SC="*fp32", HM="*bf16", MEAN="*fp32", sxb="i32", sxh="i32", sxs="i32", sxd="i32", svb="i32",
                 svh="i32", svs="i32", svd="i32", S="i32", SP="i32", rsqrt_d="fp32", mult="fp32", QMEAN="*fp32",
                 BIAS="*fp32", bias_mult="fp32")
    c = dict(D=128, BS=128, HW_CVT=True, **const)
    sig, constexprs, attrs = kernel_sass._signature(fn, types, c)
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=kernel_sass.TARGET, options={"num_warps": prepass_int8.WARPS})
    regs, spills = kernel_sass.register_use(compiled)
    print(f"{kernel} {const}: registers {regs}, spill-store bytes {spills}")
    assert regs and max(regs) <= 255 and spills and max(spills) == 0


def test_the_int8_kernel_settings_travel_as_a_string_that_torch_compile_builds_in_graph():
    import torch

    from fsattn_diffusers.kernels.sm90.ops_int8 import parse_settings_key, launch_args, settings_key
    from fsattn_diffusers.recipe import get_recipe

    from fsattn_diffusers.smoothing import q_smoothing_ratio2

    for name in ("int8-bf16", "int8-bf16+key_order=diagonal+rollback_floor_log2=10", "int8-bf16+rollback=false",
                 "int8-bf16+smooth_q=true", "int8-bf16+smooth_q=true+smooth_q_min_ratio=0+exponential=exact",
                 "int8-fp8", "int8-fp8+smooth_q=false+rollback_floor_log2=none"):
        recipe = get_recipe(name)
        key = settings_key(recipe)
        print(name, key)
        ratio2 = q_smoothing_ratio2(recipe.smooth_q_min_ratio) if recipe.smooth_q else None
        assert parse_settings_key(key) == (recipe.hadamard_signs, recipe.smooth_k, ratio2, recipe.v_format,
                                           launch_args(recipe))
    recipe = get_recipe("int8-bf16")
    explained = torch._dynamo.explain(lambda x: x * len(settings_key(recipe)))(torch.ones(3))
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp6", "mxfp4"])
def test_the_mx_pre_pass_compiles_for_sm90a_in_its_gpu_configuration(recipe):
    """The GPU-only branches of the MX pre-pass (hardware casts, the fast element roundings) compile: the interpreter
    runs the other branches, so a name those branches alone use would otherwise first fail on the device."""
    import triton
    from triton.compiler import ASTSource

    from fsattn_diffusers.kernels.sm90 import prepass
    from fsattn_diffusers.kernels.sm90.plan import ELEM, plan_for
    from fsattn_diffusers.recipe import get_recipe

    plan = plan_for(get_recipe(recipe))
    qk = dict(zip(("MBITS", "EMIN", "MAXV", "EMAX"), ELEM[plan.qk_fmt]))
    v = dict(zip(("MBITS", "EMIN", "MAXV", "EMAX"), ELEM[plan.v_fmt]))
    types = dict(kernel_sass.TYPES, X="*bf16", V="*bf16", OUT="*fp8e4nv", OUTE="*i32", HM="*bf16", AMAX="*fp32",
                 MEAN="*fp32", QMEAN="*fp32", QFLOOR="*i32", QSEL="*i32", sxb="i32", sxh="i32", sxs="i32", sxd="i32",
                 svb="i32", svh="i32", svs="i32", svd="i32", S="i32", SP="i32", N_TILES="i32", rsqrt_d="fp32",
                 mult="fp32", bias_mult="fp32")
    configs = [
        (prepass._qk_prepass_kernel, prepass.QK_WARPS,
         dict(D=128, BS=prepass.ROWS, HAD=plan.hadamard, ROUND_TWICE=plan.qk_fmt == 0, RULE=plan.qk_rule,
              T0=plan.qk_t0, TILE_REF=True, DOT_F32=False, NAN_PAD=True, HAS_KVL=True, HW_CVT=True,
              FAST_ELEM=prepass.FAST_ELEM_ROUNDING, HAS_FLAGS=True, **qk)),
        (prepass._v_quant_kernel, prepass.V_WARPS,
         dict(D=128, BS=prepass.KEY_TILE, MX=plan.v_mx, HAS_KVL=True, RULE=plan.v_rule, T0=plan.v_t0, PERM_V=True,
              HW_CVT=True, FAST_ELEM=prepass.FAST_ELEM_ROUNDING, **v)),
    ]
    for fn, warps, const in configs:
        sig, constexprs, attrs = kernel_sass._signature(fn, types, const)
        compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                                  target=kernel_sass.TARGET, options={"num_warps": warps})
        regs, spills = kernel_sass.register_use(compiled)
        print(f"{recipe} {fn.__name__}: registers {regs}, spill-store bytes {spills}")
        assert regs and max(regs) <= 255


def test_fp8_p_outside_its_numerics_is_refused_before_the_launch():
    """The INT8 kernel's FP8 P runs the exact exponential, ``P 2^4`` and the gate's cap at most 4 only (sm90_numerics
    difference 13): Schraudolph's patterns would saturate every P at 448. Refused with one line before any operand
    is read, as is V's format against ``pv_fp8``."""
    import torch

    from fsattn_diffusers.kernels.sm90.ops_int8 import Int8Operands, attention_int8_from_operands, launch_args
    from fsattn_diffusers.recipe import get_recipe

    def ops(v_dtype):
        z = torch.zeros
        return Int8Operands(z(1, 1, 128, 128, dtype=torch.int8), z(1, 1, 128), z(1, 1, 128, 128, dtype=torch.int8),
                            z(1, 1, 1), z(1, 1, 128, 128, dtype=v_dtype),
                            z(1, 1, 128) if v_dtype != torch.bfloat16 else None, None, None, None)

    out = torch.full((1, 1, 128, 128), float("nan"))
    fp8 = launch_args(get_recipe("int8-fp8"))
    for bad in (dict(exp2=0), dict(sigma=3.0), dict(cap=32.0)):
        with pytest.raises(ValueError, match="FP8 P") as info:
            attention_int8_from_operands(ops(torch.float8_e4m3fn), out, 128, 128, **{**fp8, **bad})
        print(info.value)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="pv_fp8"):
        attention_int8_from_operands(ops(torch.bfloat16), out, 128, 128, **fp8)
    with pytest.raises(ValueError, match="pv_fp8"):
        attention_int8_from_operands(ops(torch.float8_e4m3fn), out, 128, 128, **launch_args(get_recipe("int8-bf16")))
    assert bool(out.isnan().all())
