"""Measurement harnesses: the paper's accuracy tables, the structured-input suite, the kernel fuzz, end-to-end
transformer timing, the sequence-parallel checks and scaling runs. The library never imports this package; the
``fsattn`` commands, tests and scripts do."""
