"""Measurement harnesses: the paper's accuracy tables, the structured-input suite, the kernel fuzz, end-to-end
transformer timing, the sequence-parallel checks and scaling runs. The library never imports this package; the
``fsattn`` commands, tests and scripts do."""

#: The backend whose own kernels the kernel harnesses measure (``kernel_bench``, ``kernel_sass``, ``kernel_fuzz``,
#: ``fsattn bench``) and whose numerics the CPU measurements of those kernels model: its ``Backend.kernels`` and
#: ``Backend.computes`` (:mod:`fsattn_diffusers.backends.registry`).
KERNEL_BACKEND = "triton"


def kernel_recipe(name: str):
    """The recipe ``name`` (a preset, with changes such as ``"int8-fp8+exponential=exact"``) in the numerics the
    kernels of :data:`KERNEL_BACKEND` compute (``fsattn_diffusers.backends.computed_numerics``)."""
    from ..backends import computed_numerics
    from ..recipe import get_recipe

    recipe = get_recipe(name)
    return recipe.replace(numerics=computed_numerics(KERNEL_BACKEND, recipe))
