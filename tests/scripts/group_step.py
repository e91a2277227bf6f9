"""One group-trainer step on fixed groups; prints the metrics as JSON (run under torchrun by the tests).

Usage: group_step.py MODEL_DIR DEEPSPEED|none OUT_DIR [trainer_key=json_value ...]
"""

from __future__ import annotations

import json
import os
import sys

import torch

from memrl.data.schemas import Group, GroupSample
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
from memrl.train.policy import LoraSettings, PolicySpec


def main() -> None:
    model_dir, deepspeed, out = sys.argv[1], sys.argv[2], sys.argv[3]
    overrides = {k: json.loads(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
    cfg = GroupTrainerConfig(
        **{
            "lr": 1e-3,
            "lora": LoraSettings(enabled=False),
            "deepspeed": deepspeed if deepspeed != "none" else None,
            "micro_batches": 2,
            "update_epochs": 1,  # one optimizer step unless a test asks for more (the defaults are 2 x 2)
            "optimizer_steps_per_epoch": 1,
            **overrides,
        }
    )
    trainer = GroupTrainer(PolicySpec(base=model_dir), cfg)
    tok = trainer.tokenizer
    groups = []
    for k, (good, bad) in enumerate(
        [
            ("the red key is in drawer 5", "nothing relevant"),
            ("blue box", "no"),
            ("the old lamp is in chest 2", "the old lamp"),
        ]
    ):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": f"question {k}"}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        samples = [
            GroupSample(response_ids=tok.encode(t, add_special_tokens=False), reward=r, advantage=a)
            for t, r, a in ((good, 1.0, 1.0), (bad, 0.0, -1.0))
        ]
        groups.append(Group(group_id=f"g{k}", prompt_ids=list(prompt), samples=samples))
    metrics = trainer.step(groups)
    trainer.save_policy(out)
    world = trainer.accelerator.num_processes
    scored = [trainer.scored_rows] * world
    if world > 1:
        torch.distributed.all_gather_object(scored, trainer.scored_rows)
    if trainer.accelerator.is_main_process:
        report = {"world": world, "scored_rows": scored, **{k: metrics[k] for k in ("loss", "grad_norm", "rows", "lr")}}
        print("METRICS " + json.dumps(report), flush=True)
    if world > 1:  # leave together: a rank exiting while the other is still in gloo aborts it ("terminate called")
        trainer.accelerator.wait_for_everyone()
        torch.distributed.destroy_process_group()
        # Even then, about 1 run in 10 aborted in interpreter teardown ("terminate called without an active exception":
        # a torch background thread destroyed while joinable) after all the work was done and reported. Skip the
        # teardown: everything this script produces is flushed and written by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
