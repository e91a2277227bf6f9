"""Shared fixtures: the tiny model (built once per machine, cached under .cache/models) and offline settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The slow tier runs on two pytest-xdist workers (launch/test.sh: -n 2 --dist loadgroup). A test is its own unit of
# work unless it shares with other tests what is costly to start (a module-scoped fixture: an engine, a Ray cluster,
# a reference run; a session fixture named here) or must not overlap them (builds of the source tree's wheel write
# build/ in the tree): those run on one worker, one after the other.
SHARED_SESSION_FIXTURES = ("vllm_server_16k",)
SERIAL_MODULES = {"test_packaging": "wheel-build", "test_own_package": "wheel-build"}
# Modules that hold the slow tier's longest tests (90-160 s each on a 2-core machine), run first, in this order: the
# workers take tests in collection order, and a long test taken last leaves the other worker idle for its length (the
# SmolLM2 tutorial, 116 s, came last but one alphabetically).
LONGEST_FIRST = (
    "test_tutorials",
    "test_signals",
    "test_bench_pivot_learning",
    "test_bench_gpu_trainer",
    "test_bench_textworld",
    "test_smollm2",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's ``xdist_group`` (read by ``--dist loadgroup`` only)."""
    for item in items:
        if item.get_closest_marker("xdist_group") or not isinstance(item, pytest.Function):
            continue
        module = item.module.__name__.rpartition(".")[2]
        shared = [name for name in SHARED_SESSION_FIXTURES if name in item.fixturenames]
        scopes = {defs[-1].scope for defs in item._fixtureinfo.name2fixturedefs.values() if defs}
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
        elif module in SERIAL_MODULES:
            item.add_marker(pytest.mark.xdist_group(SERIAL_MODULES[module]))
        elif scopes & {"module", "class", "package"}:
            item.add_marker(pytest.mark.xdist_group(module))
    items.sort(key=longest_first)  # stable: within a module, and among the other modules, collection order
    if getattr(config.option, "loadgroup", False):  # a pytest-xdist worker under --dist loadgroup
        _suffix_groups(items)


def longest_first(item: pytest.Item) -> int:
    """Sort key: the position of the item's module in :data:`LONGEST_FIRST`, after them every other module."""
    module = Path(str(item.path)).stem
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def _suffix_groups(items: list[pytest.Item]) -> None:
    """Give each grouped test's node id the ``@group`` suffix that pytest-xdist's scheduler groups by. pytest-xdist
    (3.8) writes it to ``item._nodeid``, which pytest 9.2 no longer reads (the id is ``item._id``): without this no
    group holds, every worker starts the shared fixtures again and the wheel builds overlap. This is pytest-xdist's
    open issue 1386; its proposed fix (pull request 1388) writes the structured id as here. Delete this once a
    pytest-xdist release carries it."""
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")
        }
        if names and hasattr(item, "_id") and "@" not in item.nodeid:
            item._id = type(item._id).parse(f"{item.nodeid}@{'_'.join(sorted(names))}")


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """Where tiny models are cached between test runs."""
    return Path(os.environ.get("MEMRL_MODEL_CACHE", ROOT / ".cache" / "models"))


@pytest.fixture(scope="session")
def tiny_model_dir(model_cache: Path) -> Path:
    """The default tiny model (2 layers x 128, head_dim 64), built on first use."""
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

    return ensure_tiny_model(model_cache, TinyModelSpec())


@pytest.fixture(scope="session")
def vllm_server_16k(model_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real vLLM OpenAI-compatible server for the slow tests that talk to one (starting it is most of their
    cost): the default tiny model with 16K positions (the LoCoMo recipe's replies pile up in its context), prompt-token
    details on, started, awaited and stopped by launch/serve_endpoints.sh (tests/served.py). Yields (the ``/v1`` base
    URL, the model's folder)."""
    from served import vllm_server

    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

    model = ensure_tiny_model(model_cache, TinyModelSpec(max_position=16384))
    # beside the script's CPU command line: a KV cache of 256 MiB, and no chunked prefill (seeded requests with
    # chunked prefill crash the CPU sampler)
    bounds = ("--kv-cache-memory-bytes", str(256 << 20), "--no-enable-chunked-prefill")
    args = ("--max-model-len", "16384", "--", "--enable-prompt-tokens-details", *bounds)
    with vllm_server(model, tmp_path_factory.mktemp("vllm-server"), *args) as url:
        yield url, model
