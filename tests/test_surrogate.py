"""The training loss (memrl.train.surrogate.surrogate_loss) against hand-computed values and gradients, and the
readable padded reference of tests/reference_surrogate.py against the same numbers."""

from __future__ import annotations

import math

import pytest
import torch
from reference_surrogate import clipped_surrogate

from memrl.train.surrogate import surrogate_loss

# Two samples x three token slots; sample 1 has two real tokens. Advantages +1 and -2.
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, -0.5, 0.0]])
NEW = torch.tensor([[-0.5, -1.0, -1.5], [-0.2, -1.5, 0.0]])  # ratios e^.5, 1, e^-.5 | e^.3, e^-1
ADV = torch.tensor([1.0, -2.0])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
EPS = 0.2


def reference(new: list[list[float]]) -> tuple[list[list[float]], list[list[float]]]:
    """Per-token loss and d loss / d logprob, by hand, for the clipped objective."""
    losses, grads = [], []
    for i in range(2):
        row_l, row_g = [], []
        for t in range(3):
            if not MASK[i, t]:
                row_l.append(0.0)
                row_g.append(0.0)
                continue
            ratio = math.exp(new[i][t] - OLD[i, t].item())
            a = ADV[i].item()
            unclipped, clipped = ratio * a, min(max(ratio, 1 - EPS), 1 + EPS) * a
            if unclipped <= clipped:
                row_l.append(-unclipped)
                row_g.append(-a * ratio)
            else:
                row_l.append(-clipped)
                row_g.append(0.0)  # gradient stopped by the clip
        losses.append(row_l)
        grads.append(row_g)
    return losses, grads


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


class Out:
    """The production loss summed over the masked tokens, with the diagnostics the trainer logs."""

    def __init__(self, terms, mask: torch.Tensor) -> None:
        m = mask.bool()
        self.loss = terms.weighted[m].sum()
        self.clip_fraction = float(terms.was_clipped[m].mean())
        self.kl_ref = float(terms.kl[m].mean()) if terms.kl is not None else 0.0
        self.tis_weight_mean = float(terms.tis_weight[m].mean()) if terms.tis_weight is not None else 1.0


def production(new: torch.Tensor, aggregation: str = "token-mean", clip_high: float = EPS, **kw: object) -> Out:
    """surrogate_loss on the padded test tensors: per-token advantages and row lengths, the batch's normalizer."""
    lengths = MASK.sum(-1, keepdim=True).expand_as(MASK)
    normalizer = float(MASK.sum()) if aggregation == "token-mean" else 2.0
    terms = surrogate_loss(
        new,
        OLD,
        ADV.unsqueeze(-1).expand_as(NEW),
        lengths,
        aggregation=aggregation,
        normalizer=normalizer,
        clip_low=EPS,
        clip_high=clip_high,
        **kw,
    )
    return Out(terms, MASK)


def run(aggregation: str, **kw: object) -> tuple[torch.Tensor, torch.Tensor, object]:
    new = NEW.clone().requires_grad_(True)
    out = production(new, aggregation, **kw)
    out.loss.backward()
    return out.loss.detach(), new.grad, out


def test_token_mean_loss_and_gradient_match_hand_computation() -> None:
    losses, grads = reference(NEW.tolist())
    loss, grad, out = run("token-mean")
    assert loss.item() == pytest.approx(sum(map(sum, losses)) / 5)
    assert flat(grad.tolist()) == pytest.approx(flat([[g / 5 for g in row] for row in grads]))
    # clipped tokens: sample 0 token 0 (ratio e^.5 > 1.2, A>0) and sample 1 token 0 (ratio e^.3 > 1.2 with A<0 is
    # NOT clipped: the min keeps the unclipped, more pessimistic branch) and sample 1 token 1 (ratio e^-1 < 0.8, A<0)
    assert out.clip_fraction == pytest.approx(2 / 5)


def test_sequence_mean_weights_samples_equally() -> None:
    losses, grads = reference(NEW.tolist())
    loss, grad, _ = run("sequence-mean")
    assert loss.item() == pytest.approx((sum(losses[0]) / 3 + sum(losses[1]) / 2) / 2)
    expected = [[g / 3 / 2 for g in grads[0]], [g / 2 / 2 for g in grads[1]]]
    assert flat(grad.tolist()) == pytest.approx(flat(expected))


def test_asymmetric_clip_range() -> None:
    new = NEW.clone().requires_grad_(True)
    out = production(new, clip_high=0.7)  # e^.5 = 1.65 < 1.7: not clipped
    out.loss.backward()
    assert new.grad[0, 0].item() == pytest.approx(-1.0 * math.exp(0.5) / 5)
    assert out.clip_fraction == pytest.approx(1 / 5)


def test_kl_to_reference_adds_k3_term_and_its_gradient() -> None:
    ref = torch.tensor([[-0.7, -1.0, -1.0], [-0.2, -1.0, 0.0]])
    losses, grads = reference(NEW.tolist())
    beta = 0.1
    loss, grad, out = run("token-mean", ref_logprobs=ref, kl_coef=beta)
    kl, dkl = [], []
    for i in range(2):
        for t in range(3):
            if MASK[i, t]:
                d = ref[i, t].item() - NEW[i, t].item()
                kl.append(math.exp(d) - d - 1)
                dkl.append((i, t, 1 - math.exp(d)))
    assert loss.item() == pytest.approx((sum(map(sum, losses)) + beta * sum(kl)) / 5)
    expected = [[g / 5 for g in row] for row in grads]
    for i, t, g in dkl:
        expected[i][t] += beta * g / 5
    assert flat(grad.tolist()) == pytest.approx(flat(expected))
    assert out.kl_ref == pytest.approx(sum(kl) / 5)


def test_kl_off_equals_no_reference() -> None:
    ref = NEW - 0.3
    a, _, _ = run("token-mean", ref_logprobs=ref, kl_coef=0.0)
    b, _, _ = run("token-mean")
    assert a.item() == pytest.approx(b.item())


def test_truncated_importance_weights_scale_and_cap() -> None:
    rollout = OLD - torch.tensor([[0.1, 2.0, 0.0], [0.0, 0.0, 0.0]])  # weights e^.1, e^2 -> capped at 2, 1, ...
    losses, grads = reference(NEW.tolist())
    loss, grad, out = run("token-mean", rollout_logprobs=rollout, tis_cap=2.0)
    w = [[math.exp(0.1), 2.0, 1.0], [1.0, 1.0, 1.0]]
    assert loss.item() == pytest.approx(sum(w[i][t] * losses[i][t] for i in range(2) for t in range(3)) / 5)
    assert flat(grad.tolist()) == pytest.approx(flat([[w[i][t] * grads[i][t] / 5 for t in range(3)] for i in range(2)]))
    assert out.tis_weight_mean == pytest.approx((math.exp(0.1) + 2 + 1 + 1 + 1) / 5)


@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-mean"])
def test_production_loss_equals_the_readable_reference(aggregation: str) -> None:
    ref_lp = torch.tensor([[-0.7, -1.0, -1.0], [-0.2, -1.0, 0.0]])
    rollout = OLD - torch.tensor([[0.1, 2.0, 0.0], [0.0, 0.3, 0.0]])
    kw = {"ref_logprobs": ref_lp, "kl_coef": 0.1, "rollout_logprobs": rollout, "tis_cap": 2.0}
    new_a, new_b = NEW.clone().requires_grad_(True), NEW.clone().requires_grad_(True)
    ours = production(new_a, aggregation, clip_high=0.28, **kw)
    theirs = clipped_surrogate(new_b, OLD, ADV, MASK, clip_low=EPS, clip_high=0.28, aggregation=aggregation, **kw)
    ours.loss.backward()
    theirs.loss.backward()
    assert ours.loss.item() == pytest.approx(theirs.loss.item())
    assert flat(new_a.grad.tolist()) == pytest.approx(flat(new_b.grad.tolist()))
    assert ours.clip_fraction == pytest.approx(theirs.clip_fraction)
    assert ours.kl_ref == pytest.approx(theirs.kl_ref)
    assert ours.tis_weight_mean == pytest.approx(theirs.tis_weight_mean)


def test_unknown_aggregation_is_refused() -> None:
    with pytest.raises(ValueError, match="aggregation"):
        production(NEW.clone(), "row-sum")
