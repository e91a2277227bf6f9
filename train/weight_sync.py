"""Weight sync from the trainer into the rollout engines: the in-memory path for full weights on GPUs, and the check
that every sync, on any path, reached every engine.

**Sync verification** (:class:`SyncVerifier`, ``loop.sync_check``): after a sync (LoRA adapter or full weights, one
in-process engine or a fleet, disk or NCCL) each engine answers a small fixed probe greedily with its log-probs
(:meth:`memrl.rollout.engines.base.Engine.probe_logprobs`), and the trainer scores the same tokens. The run stops
(:class:`SyncCheckError`, one line naming the engine, the version and the gap) when an engine's mean per-token gap
exceeds the tolerance, when it reports another policy version than the one synced, or when its answer did not move
at all since the previous check although the trainer's log-probs on those very tokens did (a sync the engine
ignored, however small the update). The check's seconds and the gap are returned as metrics (``sync_check_s``,
``sync_check_gap``); ``every: N`` checks every N-th sync (the first, at the start, always). A missed sync shows as
a gap only once the update moved the probe's log-probs by more than the tolerance; the unchanged-answer test covers
smaller updates. The default tolerances are measured (docs/results/reliability.md): :data:`FP32_TOLERANCE` when the
trainer scores in fp32, :data:`BF16_TOLERANCE` under bf16 autocast.

**In-memory full-weight sync** (GPU only).

vLLM's weight-transfer API (docs: "Weight Transfer", backend ``nccl``): the engines are built with
``WeightTransferConfig(backend="nccl")`` (``EngineConfig.weight_transfer``); the trainer opens one NCCL group with
rank 0 of the trainer as sender and every engine's TP ranks as receivers
(:meth:`memrl.rollout.fleet.RolloutFleet.weight_sync_client` gives worker ``j`` the ranks ``1 + j * TP``), and each sync
broadcasts every parameter once. Under ZeRO-3 each parameter is gathered on the fly (``GatheredParameters``, a
collective every training rank joins), so no rank ever holds the whole model. This is the path OpenRLHF and verl
take; LoRA policies keep the adapter fan-out, which is small.

On CPU (vLLM's CPU backend has no NCCL) and as the fallback, the online loop saves the weights to ``policy/vNNNNN``
and every worker reloads them in place (:meth:`memrl.rollout.fleet.RolloutFleet.update_weights`).

None of this module has run on a GPU: it is written against vLLM's documented trainer-side API
(``WeightTransferTrainerFactory.trainer_init``, ``NCCLTrainerInitInfo``, ``WeightSource``, ``send_weights``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import torch
from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.errors import UserError
from memrl.rollout.engines.base import EngineError, EngineProbe

__all__ = [
    "BF16_TOLERANCE",
    "FP32_TOLERANCE",
    "PROBE_TEXTS",
    "InMemoryWeightSync",
    "SyncCheckConfig",
    "SyncCheckError",
    "SyncVerifier",
    "gathered_source",
    "probe_prompts",
]

log = logging.getLogger(__name__)

FP32_TOLERANCE = 1e-3
"""Default largest mean per-token log-prob gap between an engine and a trainer that scores in fp32. Measured on CPU
(docs/results/reliability.md): 2e-7 (tiny model) and 8e-6 (SmolLM2-135M) with fp32 transformers and vLLM engines;
an engine that missed one update was 5e-3 to 9e-2 away."""
BF16_TOLERANCE = 0.15
"""Default largest gap when the trainer scores under bf16 autocast (``trainer.bf16``). Measured against fp32
engines: 2e-3 (tiny model), 0.022 to 0.041 (SmolLM2-135M): one missed update (about 0.03) hides in that noise, and
the unchanged-answer test is what catches it."""

PROBE_TEXTS = (
    "Summarise what is established so far: the red key opened the north door and the cellar is still locked.",
    "Which page mentions the blue chest? Answer with the page id and what the chest held.",
    "The user prefers short answers, lives in Lisbon and asked twice about train times on Sundays.",
    "Step 12: the build failed with a missing header; step 13: the header path was added to the include list.",
    "Recall the facts needed to answer: where did the agent leave the lamp before entering the kitchen?",
    "Notes: meeting moved to Thursday; budget approved at 40k; Ana owns the migration; risks are unresolved.",
    "Observation: you see a wooden table, a silver coin and a closed drawer. Inventory: a torch and a map.",
    "Rewrite the cue so that it keeps the ruled-out options: not in the attic, not in the garden shed.",
)
"""The texts of the weight-sync probe (memory-model-like requests), rendered with the tokenizer's chat template."""


class SyncCheckConfig(ConfigModel):
    """The check after every weight sync that each engine serves the trainer's weights (module docstring)."""

    every: int = Field(1, ge=0, le=10**6)  # check every this many syncs (the first, at the start, always); 0: off
    tolerance: float | None = Field(None, gt=0, le=100)  # largest mean per-token log-prob gap; None: by precision
    prompts: int = Field(4, ge=1, le=len(PROBE_TEXTS))  # probe prompts (of PROBE_TEXTS)
    max_tokens: int = Field(16, ge=1, le=1024)  # greedy tokens per probe prompt


class SyncCheckError(UserError):
    """An engine does not serve the weights the trainer synced (the message names the engine, version and gap)."""


def probe_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """The first ``count`` probe texts as prompt ids: a user message in the tokenizer's chat template (what a memory
    model is asked), or the plain text for a tokenizer without one."""
    prompts = []
    for text in PROBE_TEXTS[:count]:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        else:
            ids = tokenizer.encode(text)
        prompts.append([int(i) for i in ids])
    return prompts


class SyncVerifier:
    """Checks after a sync that every engine answers the probe with the trainer's log-probs (module docstring).

    Call :meth:`check` on every training process after each sync: the main process asks the engines, their answers
    go to every process (JSON), every process scores them (ZeRO-3 gathers in every forward) and reaches the same
    verdict, so all of them stop together."""

    def __init__(self, trainer: Any, cfg: SyncCheckConfig) -> None:
        self.trainer, self.cfg = trainer, cfg
        self.tolerance = cfg.tolerance or (BF16_TOLERANCE if trainer.cfg.bf16 else FP32_TOLERANCE)
        self.prompts: list[list[int]] = []  # built at the first check (from the trainer's tokenizer)
        self.syncs = 0
        self.off = ""  # why the check is off for this run (an engine that cannot be probed)
        # engine -> (version, its answer, the trainer's log-probs of those tokens) at the previous check
        self.previous: dict[str, tuple[int, EngineProbe, list[list[float]]]] = {}

    def check(self, engine: Any) -> dict[str, float]:
        """After a sync to ``trainer.version``: probe ``engine`` (a fleet, or one engine; None on the processes
        without one) when this sync is due; raise :class:`SyncCheckError` on a mismatch. Returns the metrics."""
        self.syncs += 1
        if not self.cfg.every or (self.syncs - 1) % self.cfg.every or self.off:
            return {}
        if not self.prompts:
            tokenizer = getattr(self.trainer, "tokenizer", None)
            if tokenizer is None:  # a stand-in trainer without a model (benchmarks/rollout_scaling.py)
                self.off = "the trainer has no tokenizer to build the probe with"
                log.warning(f"weight sync check off for this run: {self.off}")
                return {}
            self.prompts = probe_prompts(tokenizer, self.cfg.prompts)
        t0 = time.perf_counter()
        acc, version = self.trainer.accelerator, self.trainer.version
        payload: list[str] = [""]
        if acc.is_main_process:
            payload[0] = json.dumps(self._ask(engine))
        if acc.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            broadcast_object_list(payload, from_process=0)
        asked = json.loads(payload[0])
        if asked["off"]:
            self.off = asked["off"]
            log.warning(f"weight sync check off for this run: {self.off}")
            return {}
        answers = [EngineProbe(**a) for a in asked["answers"]]
        # the prompts each engine answered with tokens and their log-probs (the rest cannot be compared)
        measured = [
            (a, [i for i, (r, lp) in enumerate(zip(a.response_ids, a.logprobs, strict=True)) if r and lp])
            for a in answers
        ]
        measured = [(a, kept) for a, kept in measured if kept]
        pairs = [(self.prompts[i], a.response_ids[i]) for a, kept in measured for i in kept]
        scored = [t.tolist() for t in self.trainer.logprobs_of(pairs)] if pairs else []
        worst, tokens = 0.0, 0
        for answer, kept in measured:
            mine, scored = scored[: len(kept)], scored[len(kept) :]
            gap, n = _gap([answer.logprobs[i] for i in kept], mine)
            worst, tokens = max(worst, gap), tokens + n
            self._verdict(answer, mine, gap, n, version)
        seconds = time.perf_counter() - t0
        if self.syncs == 1 and acc.is_main_process:
            log.info(
                f"weight sync check: {len(measured)} of {len(answers)} engines answer with log-probs; version "
                f"{version}: largest gap {worst:.3g} per token over {tokens} tokens (tolerance "
                f"{self.tolerance:.3g}), {seconds:.2f} s"
            )
        return {"sync_check_s": seconds, "sync_check_gap": worst, "sync_check_engines": float(len(measured))}

    def _ask(self, engine: Any) -> dict[str, Any]:
        if engine is None:
            return {"off": "no rollout engine", "answers": []}
        try:
            answers = engine.probe_logprobs(self.prompts, self.cfg.max_tokens)
        except EngineError as exc:
            return {"off": f"the engine cannot answer the probe ({exc})", "answers": []}
        if not any(any(a.logprobs) for a in answers):
            return {"off": "no engine reports log-probs (a scripted policy has no distribution)", "answers": []}
        return {"off": "", "answers": [asdict(a) for a in answers]}

    def _verdict(self, answer: EngineProbe, mine: list[list[float]], gap: float, tokens: int, version: int) -> None:
        """Raise :class:`SyncCheckError` if ``answer`` is not the trainer's policy ``version``; remember it."""
        fix = (
            "an engine that did not take the sync, serves another model or adapter, or computes in another "
            "precision; loop.sync_check.tolerance sets the gap allowed, loop.sync_check.every=0 turns the check "
            "off"
        )
        if answer.version != version:
            raise SyncCheckError(
                f"weight sync check: engine {answer.engine} serves policy version {answer.version} "
                f"after the sync of version {version} ({fix})"
            )
        if gap > self.tolerance:
            raise SyncCheckError(
                f"weight sync check: engine {answer.engine} at policy version {version} answers "
                f"the probe {gap:.3g} per token (mean |log-prob difference| over {tokens} tokens) "
                f"away from the trainer, tolerance {self.tolerance:.3g} ({fix})"
            )
        before = self.previous.get(answer.engine)
        if (
            before is not None
            and before[0] != version
            and before[1].response_ids == answer.response_ids
            and before[1].logprobs == answer.logprobs
        ):
            moved, _ = _gap(before[2], mine)
            if moved > self.tolerance / 10:
                raise SyncCheckError(
                    f"weight sync check: engine {answer.engine} answers the probe exactly as at policy version "
                    f"{before[0]} after the sync of version {version}, while the trainer's log-probs on those "
                    f"tokens moved {moved:.3g} per token: the engine did not take the new weights ({fix})"
                )
        self.previous[answer.engine] = (version, answer, mine)


def _gap(engine: list[list[float]], trainer: list[list[float]]) -> tuple[float, int]:
    """Mean absolute per-token difference of two sets of per-prompt log-probs, and the tokens compared."""
    diffs = [abs(a - b) for e, t in zip(engine, trainer, strict=True) for a, b in zip(e, t, strict=True)]
    return (sum(diffs) / len(diffs) if diffs else 0.0), len(diffs)


def gathered_source(model: torch.nn.Module) -> Any:
    """A vLLM ``WeightSource`` over the unwrapped model's parameters (HF names, which vLLM's loaders map), ZeRO-3
    partitions gathered one parameter at a time."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class _Gathered(WeightSource):
        def metadata(self) -> list[Any]:
            return [
                ParamMeta(name, p.dtype, tuple(getattr(p, "ds_shape", p.shape))) for name, p in model.named_parameters()
            ]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for name, param in model.named_parameters():
                if hasattr(param, "ds_id"):  # a ZeRO-3 partition: every rank joins the gather
                    import deepspeed

                    with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                        yield name, param.data
                else:
                    yield name, param.data

    return _Gathered()


class InMemoryWeightSync:
    """Broadcast the trainer's full weights to every engine of a fleet; call :meth:`send` on every training rank.

    The NCCL group is opened on the first send and reopened when the fleet's live workers change or one of them
    restarted (a worker that died held ranks of the old group; its restarted engine never joined it).
    """

    def __init__(self, trainer: Any, fleet: Any | None) -> None:
        self.trainer, self.fleet = trainer, fleet  # the fleet exists on the main process only
        self.engine: Any = None
        self.members: tuple[tuple[int, ...], int] = ((), 0)  # the live workers and the fleet's restarts at opening

    def _open(self) -> None:
        from accelerate.utils import broadcast_object_list
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
        from vllm.utils.network_utils import get_ip, get_open_port

        acc = self.trainer.accelerator
        payload: list[Any] = [None]
        if acc.is_main_process:
            self.members = (tuple(self.fleet.live()), self.fleet.restarts)
            payload[0] = (get_ip(), get_open_port(), 1 + len(self.members[0]) * self.fleet.tp)
        if acc.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        host, port, world = payload[0]
        if self.engine is not None:
            self.engine.shutdown()
        info = NCCLTrainerInitInfo(master_address=host, master_port=port, world_size=world, rank=acc.process_index)
        client = self.fleet.weight_sync_client() if acc.is_main_process else None
        source = gathered_source(acc.unwrap_model(self.trainer.model))
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)

    def send(self, path: str | None = None) -> None:
        """Broadcast the current weights and have every engine serve them as ``trainer.version``; ``path`` (when the
        version was also saved) is what a restarted worker reloads."""
        acc = self.trainer.accelerator
        changed = [acc.is_main_process and (tuple(self.fleet.live()), self.fleet.restarts) != self.members]
        if acc.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            broadcast_object_list(changed, from_process=0)
        if self.engine is None or changed[0]:
            self._open()
        self.engine.send_weights()
        if acc.is_main_process:
            self.fleet.set_version(self.trainer.version, path)
