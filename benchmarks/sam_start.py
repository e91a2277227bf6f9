"""The shared SFT start of a SAM setting, which the SAM benchmarks (``ablations``, ``advantage_shares``,
``credit_accuracy``) start from: the setting's limited, noisy expert distilled into the tiny Qwen3 memory model and
fine-tuned by SFT ("SAM: State-Adaptive Memory for Long-Horizon Reasoning Agent", arXiv 2605.24468, section 2.3), the
SAM memory configuration the benchmarks run inside, the frozen scripted reasoner, and the digests of the start's
weights (every figure downstream names them). Built once per setting under ``<work>/<setting>`` and reused.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import FIGURES, PhaseClock, check_bench_inputs, cpu_profile, weights_digest

__all__ = [
    "SFT_STEPS",
    "START_THREADS",
    "SamStart",
    "build_sft_start",
    "committed_starts",
    "run_sft_stage",
    "start_mismatch",
]

SFT_STEPS = 300  # the shared SFT checkpoint: the same for --quick and the full setting, so both can reuse it
# torch threads of the shared SFT start's build, whatever the machine has: no figure depends on the machine's core
# count (one thread is also the fastest on a shared 2-core machine, where OpenMP threads spin on a busy core)
START_THREADS = 1


class SamStart:
    """A SAM setting's shared SFT start: the setting, the SAM memory config, the tiny base model, the SFT checkpoint
    (``start_dir/sft/final``) and their digests (``start``), and the frozen reasoner's config.

    ``steps`` SFT steps on the expert's traces of ``distill_tasks`` tasks (None: the setting's); ``shared``: the start
    is the one the committed figures of the setting report, so a rebuilt one with other weights is named.
    """

    def __init__(
        self,
        setting: str,
        work: Path,
        model_cache: str,
        *,
        start_dir: Path | None = None,
        steps: int = SFT_STEPS,
        distill_tasks: int | None = None,
        shared: bool = True,
        clock: PhaseClock | None = None,
    ) -> None:
        from memrl.data.tasks.sam import SAM_SETTINGS
        from memrl.launch.quickstart import QuickstartConfig
        from memrl.rollout.memory.base import RoleSampling

        check_bench_inputs(Path(work), [])
        self.setting_name = setting
        self.setting = SAM_SETTINGS[setting]
        self.work = Path(work) / setting  # one folder per setting: its shared SFT start, and the runs under it
        self.start_dir = start_dir or self.work
        self.model_cache = model_cache
        self.steps, self.distill_tasks, self.shared = steps, distill_tasks, shared
        self.clock = clock or PhaseClock()
        trained = QuickstartConfig().memory  # SAM as the quickstart trains inside it, with 48-token cues
        cue = RoleSampling(temperature=0.0, max_tokens=48)
        self.memory = trained.model_copy(update={"sampling": {**trained.sampling, "consolidate": cue}})
        self.base: Path | None = None
        self.sft_dir: Path | None = None
        self.start: dict[str, str] = {}  # digests of the base and SFT weights: what every figure here starts from

    def prepare(self) -> dict[str, Any]:
        """Tiny model, distillation of the setting's expert, SFT: the shared checkpoint (reused when present), built
        with :data:`START_THREADS` torch threads whatever the machine's count (:func:`build_sft_start`); one line
        when its weights differ from the start the committed figures of this setting report."""
        from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

        t0 = time.perf_counter()
        self.base = ensure_tiny_model(self.model_cache, TinyModelSpec())
        self.sft_dir = self.start_dir / "sft" / "final"
        stats: dict[str, Any] = {}
        built = not (self.sft_dir / "config.json").exists()
        if built:
            with self.clock("sft_checkpoint"):
                stats = build_sft_start(
                    self.start_dir, self.setting, self.base, self.memory, self.steps, self.distill_tasks
                )
        self.start = {"base_weights": weights_digest(self.base)[:16], "sft_weights": weights_digest(self.sft_dir)[:16]}
        mismatch = start_mismatch(self.setting_name, self.start["sft_weights"])
        if mismatch and self.shared:
            print(mismatch, flush=True)
        return {
            "distill_traces": stats.get("traces"),
            "distill_rows": stats.get("rows"),
            **self.start,
            "built": built,
            "cpu": cpu_profile(),
            "seconds": round(time.perf_counter() - t0, 1),
        }

    def reasoner_config(self, seed: int) -> Any:
        """The frozen scripted SAM reasoner (two pages, two recalls) with the base model's tokenizer."""
        from memrl.train.oat_grpo import default_reasoner

        return default_reasoner(str(self.base), seed).model_copy(
            update={"scripted_kwargs": {"max_pages": 2, "recall_budget": 2}}
        )


def build_sft_start(
    work: Path,
    setting: Any,
    base: Path,
    memory: Any,
    steps: int = SFT_STEPS,
    distill_tasks: int | None = None,
    batch_size: int = 32,
) -> dict[str, Any]:
    """The shared SFT start of a SAM ``setting``: its expert distilled on ``distill_tasks`` (default: the
    setting's) SFT tasks into ``work/distill``, then ``steps`` SFT steps into ``work/sft/final``. Built with
    :data:`START_THREADS` torch threads whatever the machine or ``OMP_NUM_THREADS`` says: a float sum split over
    another number of threads rounds differently, and the weights (and every figure downstream) would differ."""
    from memrl.data.config import RunConfig
    from memrl.data.experts.sam import SamOracleConfig
    from memrl.data.tasks import TaskSetConfig
    from memrl.rollout.engines.base import torch_threads
    from memrl.rollout.expert_traces import DistillRunConfig, distill

    tasks = TaskSetConfig(count=distill_tasks or setting.distill_tasks, seed=0, sam=setting.sft)
    distill_cfg = DistillRunConfig(
        run=RunConfig(output_dir=str(work), name="distill", seed=0),
        tasks=tasks,
        sam_oracle=SamOracleConfig(**setting.expert),
        sam_memory=memory,
        reasoner_max_pages=2,
        tokenizer=str(base),
    )
    with torch_threads(START_THREADS):
        stats = distill(distill_cfg, work / "distill")
        run_sft_stage(work / "distill", base, work, "sft", steps, seed=0, batch_size=batch_size)
    return stats


def run_sft_stage(
    data_dir: Path, base: Path, out: Path, name: str, steps: int, seed: int, lr: float = 2e-3, batch_size: int = 32
) -> Path:
    """``steps`` full-weight SFT steps of ``batch_size`` rows from ``base`` on the distilled rows in ``data_dir``
    (cue writing 0.4, recall 0.6) into ``out/name/final``."""
    from memrl.data.config import RunConfig
    from memrl.train.policy import LoraSettings, PolicySpec
    from memrl.train.sft import SFTRunConfig, SFTTrainConfig, run_sft
    from memrl.train.sft_data import SFTDataConfig

    cfg = SFTRunConfig(
        run=RunConfig(output_dir=str(out), name=name, seed=seed),
        model=PolicySpec(base=str(base)),
        lora=LoraSettings(enabled=False),
        data=SFTDataConfig(
            dir=str(data_dir), roles={"consolidate": 0.4, "recall": 0.6}, mixture_rows=steps * batch_size
        ),
        train=SFTTrainConfig(
            max_steps=steps, batch_size=batch_size, lr=lr, warmup=0.05, max_length=512, save_steps=0, logging_steps=50
        ),
    )
    run_sft(cfg)
    return out / name / "final"


def committed_starts(setting: str, figures: Path = FIGURES) -> dict[str, str]:
    """The SFT-start digests the committed figures of ``setting`` report: ``{file name: sft_weights}`` over the
    JSON files in ``figures`` whose ``setting`` is it and that record one."""
    out = {}
    for path in sorted(figures.glob("*.json")):
        with contextlib.suppress(ValueError, OSError):
            record = json.loads(path.read_text())
            if isinstance(record, dict) and record.get("setting") == setting and record.get("sft_weights"):
                out[path.name] = record["sft_weights"]
    return out


def start_mismatch(setting: str, digest: str, figures: Path = FIGURES) -> str | None:
    """One line when the SFT start here (``digest``) is not the one the committed figures of ``setting`` started
    from (their figures will not reproduce from it), else None."""
    other = {name: d for name, d in committed_starts(setting, figures).items() if d != digest}
    if not other:
        return None
    listed = ", ".join(f"{name} ({d})" for name, d in other.items())
    return (
        f"WARNING: this SFT start has weights {digest}, not the start of the committed figures {listed} "
        f"in {figures}: figures from it will not match them"
    )
