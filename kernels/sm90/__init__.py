"""The Hopper (sm_90a) kernels: the Triton and Gluon attention kernels (wgmma, TMA, mbarriers), their pre-passes, the
recipe-to-kernel plan (:mod:`.plan`) and the host code that launches them (:mod:`.ops`, :mod:`.ops_int8`). They
compute the ``sm90`` variant of every recipe (NUMERICS.md §6); the registered backend that runs them is
:mod:`fsattn_diffusers.backends.sm90_backend`."""
