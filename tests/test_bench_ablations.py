"""benchmarks/ablations.py at its smallest setting (``--smoke``: a tiny SFT start of its own, 3 test tasks, 2 seeds):
every stage runs, the JSON keeps each variant's success per seed and task, ``--recompute`` gives the same paired
table from those records alone, and rerunning the command reuses every finished run."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import CPU_PROFILE
from tests.bench_run import bench_process

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return bench_process("ablations", list(args), cwd=cwd)


BUILD = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
import torch
from benchmarks.ablations import SMOKE
from benchmarks.sam_start import SamStart
start = SamStart("multihop", Path({out!r}), {cache!r}, start_dir=Path({out!r}) / "start",
                 steps=SMOKE.sft_steps, distill_tasks=SMOKE.distill_tasks, shared=False)
start.prepare()
print(torch.get_num_threads(), start.start["sft_weights"])
"""


# protects: benchmarks/ablations.py end to end at --smoke: its JSON last line, --recompute from the records alone, a
# rerun reusing every finished run; and its SFT start's weights do not depend on the caller's thread count (the same
# start built again by a process started with 2 threads); the fast test checks only that the count is pinned
@pytest.mark.slow
def test_smoke_run_keeps_the_records_recomputes_and_resumes(tmp_path: Path, tiny_model_dir: Path) -> None:
    common = [*shlex.split("--smoke --variants oat,sft_more"), "--work", str(tmp_path / "w")]
    common += ["--model-cache", str(tiny_model_dir.parent)]
    first = _run(*common)  # its start is built under tests/bench_run.py's OMP_NUM_THREADS=1
    assert first.returncode == 0, first.stderr[-3000:]
    record = json.loads(first.stdout.strip().splitlines()[-1])
    assert record["scale"] == "smoke" and record["seeds"] == 2 and record["setting"] == "multihop"
    assert (tmp_path / "w" / "multihop" / "start-smoke" / "sft" / "final" / "config.json").is_file()
    records = record["records"]
    assert len(records["tasks"]) == 3
    for mode in ("sampled", "greedy"):
        assert set(records[mode]) == {"sft", "oat", "sft_more"}
        assert all(
            set(by_seed) == {"0", "1"} and all(len(v) == 3 for v in by_seed.values())
            for by_seed in records[mode].values()
        )
    paired = record["paired"]["oat - sft"]["sampled"]
    assert paired["seeds"] == [0, 1] and paired["tasks"] == 3 and len(paired["per_seed"]) == 2
    for key in ("ci95", "ci95_seed_t", "ci95_two_level_bootstrap", "ci95_tasks_only"):
        assert paired[key][0] <= paired["difference"] <= paired[key][1], key

    saved = tmp_path / "ablations.json"
    saved.write_text(json.dumps(record))
    again = _run("--recompute", str(saved))
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout) == record["paired"]

    resumed = _run(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert sorted(second["reused_runs"]) == sorted(f"{v}-s{s}" for v in ("sft", "oat", "sft_more") for s in (0, 1))
    assert second["records"] == records and second["sft_weights"] == record["sft_weights"]

    # The same start built by a process started with 2 torch threads (and the benchmark's kernels, CPU_PROFILE): the
    # same weights, because the build pins its own thread count (START_THREADS) and gives the caller's back.
    script = BUILD.format(root=str(ROOT), out=str(tmp_path / "t2"), cache=str(tiny_model_dir.parent))
    two = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    env = {**os.environ, **CPU_PROFILE, **two, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    after, digest = done.stdout.split()[-2:]
    assert int(after) == 2  # the caller's thread count is restored after the build
    assert digest == record["sft_weights"]


def test_the_sft_start_is_built_with_the_pinned_thread_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import benchmarks.sam_start as sam_start
    from memrl.data.tasks.sam import SAM_SETTINGS
    from memrl.rollout.engines.base import set_torch_threads
    from memrl.rollout.memory.sam import SamConfig

    seen = []
    monkeypatch.setattr(
        "memrl.rollout.expert_traces.distill", lambda *a, **k: seen.append(torch.get_num_threads()) or {}
    )
    monkeypatch.setattr(sam_start, "run_sft_stage", lambda *a, **k: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    set_torch_threads(2)  # the caller's count differs from the pinned one
    try:
        sam_start.build_sft_start(tmp_path, SAM_SETTINGS["multihop"], tmp_path, SamConfig(), steps=1, distill_tasks=1)
        assert torch.get_num_threads() == 2  # given back
    finally:
        set_torch_threads(before)
    assert seen == [1, 1] and sam_start.START_THREADS == 1


def test_the_benchmark_process_computes_under_the_pinned_cpu_profile(tmp_path: Path) -> None:
    """pin_cpu_numerics re-executes the process (a module run with -m, as benchmarks run, or a script) with
    CPU_PROFILE's variables: torch then runs its AVX2 kernels on one thread whatever the machine has (this machine's
    own capability may be AVX512); ``native`` leaves it alone."""
    (tmp_path / "probe.py").write_text(
        "import sys\n"
        "import torch\n"  # loaded before the pin: the re-executed process starts clean anyway
        "from benchmarks.harness import cpu_profile, pin_cpu_numerics\n"
        "name = pin_cpu_numerics(native=len(sys.argv) > 1)\n"
        "print(name, cpu_profile(), torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS")}
    env.update(OMP_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    for how in (["-m", "probe"], [str(tmp_path / "probe.py")]):
        pinned = subprocess.run(
            [sys.executable, *how], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert pinned.returncode == 0, pinned.stderr[-2000:]
        assert pinned.stdout.split() == ["avx2-1thread", "avx2-1thread", "AVX2", "1"]
    native = subprocess.run(
        [sys.executable, "-m", "probe", "native"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert native.returncode == 0, native.stderr[-2000:]
    assert native.stdout.split()[:2] == ["native", "native"] and native.stdout.split()[3] == "2"
