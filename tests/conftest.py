"""Shared fixtures, and how the whole suite spreads over the CPU's cores.

``python -m pytest`` without paths (the README's test line, which CI runs) runs on pytest-xdist workers: one per core,
at most :data:`MAX_WORKERS`. Paths on the command line, ``-n``, ``--pdb`` or ``-p no:xdist`` run as pytest runs them
(``-n 0``: one process). Each worker's PyTorch, and the processes its tests start, get the worker's share of the cores
(``cores // workers`` threads, unless ``OMP_NUM_THREADS`` is set): more threads than cores make PyTorch's OpenMP
threads wait on each other (a 5 s emulator test took 55-105 s on 2 shared cores with 2 threads per worker).
"""

import os
import warnings

import pytest

#: Workers of the whole suite at most (each holds a PyTorch and its models: about 1-1.5 GB).
MAX_WORKERS = 4


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput") or "PYTEST_XDIST_WORKER" in os.environ


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    # Runs before pytest-xdist's own pytest_cmdline_main (registered earlier), which turns "auto" into workers.
    source = getattr(config, "args_source", None)  # ARGS: paths were given (older pytest: no attribute)
    whole_suite = source is not None and source.name != "ARGS"
    if (whole_suite and config.pluginmanager.hasplugin("xdist") and not _is_worker(config)
            and config.option.numprocesses is None and not config.option.usepdb):
        config.option.numprocesses = "auto"


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without the plugin (-p no:xdist) pytest ignores it
def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    return max(1, min(MAX_WORKERS, _cores()))


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if _is_worker(config) and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        threads = max(1, _cores() // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # for the processes the tests start
        torch.set_num_threads(threads)


@pytest.fixture
def quiet_slow_backend_warning():
    """Silence the emulator's one-time "slow" warning in tests that run whole pipelines on the CPU."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*emulator.*slow")
        yield
