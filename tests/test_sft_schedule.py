"""SFT logging and warm-up (issue 41 item 6): the loss is logged at least every few steps whatever the run's length,
and no optimizer step runs at lr 0 by accident (transformers' warm-up gives step 1 the factor 0)."""

from __future__ import annotations

import pytest
import torch
from transformers import get_scheduler

from memrl.train.sft import SFTTrainConfig, logging_interval, no_step_at_lr_zero


def lrs(name: str, warmup: int, steps: int, fix: bool) -> list[float]:
    """The lr each optimizer step trains at (what the optimizer holds when it steps)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    if fix:
        no_step_at_lr_zero(scheduler, warmup)
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_transformers_warmup_spends_the_first_step_at_lr_zero_and_the_fix_does_not() -> None:
    # the SmolLM2 recipe's SFT: 8 steps, warmup 0.05 -> 1 warm-up step
    assert lrs("linear", 1, 8, fix=False)[0] == 0.0
    fixed = lrs("linear", 1, 8, fix=True)
    assert fixed == pytest.approx([1.0, *lrs("linear", 1, 8, fix=False)[1:]])
    # a longer warm-up: steps 1..W train at 1/W .. 1, and the decay after it is transformers' own
    assert lrs("linear", 4, 10, fix=True)[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs("cosine", 4, 10, fix=True)[4:] == pytest.approx(lrs("cosine", 4, 10, fix=False)[4:])
    assert all(lr > 0 for lr in lrs("cosine", 3, 12, fix=True))
    assert lrs("linear", 0, 5, fix=True) == lrs("linear", 0, 5, fix=False)  # no warm-up: nothing changes


@pytest.mark.parametrize(
    ("max_steps", "logging_steps", "expected"),
    [(8, None, 1), (300, None, 15), (5000, None, 25), (8, 25, 2), (300, 10, 10), (None, None, 10)],
)
def test_the_loss_is_logged_at_least_four_times(
    max_steps: int | None, logging_steps: int | None, expected: int
) -> None:
    assert logging_interval(SFTTrainConfig(max_steps=max_steps, logging_steps=logging_steps)) == expected
