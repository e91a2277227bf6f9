"""Full-weight sync from the trainer into every rollout engine without a disk round-trip (GPU only).

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

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["InMemoryWeightSync", "gathered_source"]


def gathered_source(model: torch.nn.Module) -> Any:
    """A vLLM ``WeightSource`` over the unwrapped model's parameters (HF names, which vLLM's loaders map), ZeRO-3
    partitions gathered one parameter at a time."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class _Gathered(WeightSource):
        def metadata(self) -> list[Any]:
            return [ParamMeta(name, p.dtype, tuple(getattr(p, "ds_shape", p.shape)))
                    for name, p in model.named_parameters()]

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
