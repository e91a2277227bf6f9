"""The GPU suite (``tests/gpu``): what the trainer must do on CUDA, run on CPU at tiny shapes too where it can.

Tests marked ``gpu`` need CUDA and are skipped without it (CI's CPU run collects and skips them); their CPU twins
(the ``cpu`` parameter of :func:`device`) run everywhere. On a GPU machine: ``bash tests/gpu/run.sh`` (README,
"Multi-GPU and clusters").
"""

from __future__ import annotations

import os

import pytest
import torch

# Deterministic cuBLAS for the trainer test's bit-for-bit comparison; read when the first CUDA context starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every ``gpu`` test when there is no CUDA device."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run tests/gpu/run.sh on a GPU machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Each test that takes it runs on the CPU and, marked ``gpu``, on CUDA."""
    return torch.device(request.param)
