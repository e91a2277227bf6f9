"""bf16 on a CPU: fast where the CPU multiplies bf16 natively, many times slower where torch falls back to its own
gemm.

A CPU with AVX512-BF16 or AMX (recent Xeons, Zen 4 EPYCs) runs a bf16 matmul faster than an fp32 one; on an AVX2-only
CPU (older EPYCs among them) torch's bf16 matmul falls back to its own unoptimised gemm
(``at::native::cpublas::gemm``). On such a CPU one 1024 x 576 by 576 x 1536 product took 1.55 s against 35 ms in fp32,
and a SmolLM2-135M SFT step under bf16 autocast had not finished after 14 minutes (62 s on a CPU with native bf16).
:func:`cpu_bf16_slowdown` measures the ratio on the machine at hand; :func:`warn_if_cpu_bf16_slow` tells a user who
asked for bf16 on such a CPU, naming the setting.
"""

from __future__ import annotations

import functools
import logging
import platform
import time
from pathlib import Path

log = logging.getLogger(__name__)

SLOW_BF16 = 4.0
"""bf16 matmuls slower than fp32 by more than this factor count as the fallback path (native bf16 is faster than
fp32; the fallback measured 6-44x slower, by the matrices' layout)."""


def _matmul_seconds(dtype: object, size: int = 256, repeats: int = 3) -> float:
    """Best-of-``repeats`` seconds of ``a @ b`` plus ``a @ b.T`` for ``size``-square matrices of ``dtype``."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        a @ b.t()
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def cpu_bf16_slowdown() -> float:
    """How many times slower a bf16 matmul is than an fp32 one on this CPU (below 1: bf16 is faster)."""
    import torch

    return _matmul_seconds(torch.bfloat16) / max(_matmul_seconds(torch.float32), 1e-9)


def cpu_bf16_is_slow() -> bool:
    """Whether bf16 training here runs on a CPU whose bf16 matmuls take the fallback path (:data:`SLOW_BF16`): never
    on a machine with a CUDA GPU, which trains there."""
    import torch

    return not torch.cuda.is_available() and cpu_bf16_slowdown() > SLOW_BF16


def cpu_capability() -> str:
    """The CPU's vector capability as torch reports it (``AVX2``, ``AVX512``, ...)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


@functools.cache
def cpu_description() -> str:
    """The CPU a figure was measured on: its model name and the vector capability torch uses on it."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    return f"{names[0] if names else platform.processor() or 'unknown CPU'}, {cpu_capability()}"


def warn_if_cpu_bf16_slow(key: str) -> bool:
    """On a CPU whose bf16 matmuls take the fallback path, warn that training under ``key`` = true will be many times
    slower than fp32 (the numbers differ between the two, so it is not switched for the user). True when warned."""
    if not cpu_bf16_is_slow():
        return False
    log.warning(
        "%s is true, but bf16 matmuls on this CPU are %.0fx slower than fp32 (torch reports %s: no native bf16); "
        "set it to false to train in fp32 here, or train on a CPU with AVX512-BF16 or AMX, or on a GPU",
        key,
        cpu_bf16_slowdown(),
        cpu_capability(),
    )
    return True
