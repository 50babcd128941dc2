"""Shared fixtures."""

import warnings

import pytest


@pytest.fixture
def quiet_slow_backend_warning():
    """Silence the emulator's one-time "slow" warning in tests that run whole pipelines on the CPU."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*emulator.*slow")
        yield
