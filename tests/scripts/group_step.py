"""One group-trainer step on fixed groups; prints the metrics as JSON (run under torchrun by the tests)."""

from __future__ import annotations

import json
import sys

from data.schemas import Group, GroupSample
from train.group_trainer import GroupTrainer, GroupTrainerConfig
from train.policy import LoraSettings, PolicySpec


def main() -> None:
    model_dir, deepspeed, out = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = GroupTrainerConfig(
        lr=1e-3, lora=LoraSettings(enabled=False), deepspeed=deepspeed if deepspeed != "none" else None, micro_batches=2
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
    if trainer.accelerator.is_main_process:
        world = trainer.accelerator.num_processes
        print(
            "METRICS " + json.dumps({"world": world, **{k: metrics[k] for k in ("loss", "grad_norm", "rows")}}),
            flush=True,
        )


if __name__ == "__main__":
    main()
