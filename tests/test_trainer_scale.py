"""The group trainer at scale: response-only chunked log-probs, packed micro-batches, token budgets, KL reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fakes import ONE_STEP
from reference_surrogate import clipped_surrogate

from memrl.rollout.models import load_causal_lm
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
from memrl.train.logprobs import pack_rows, packed_hidden_states, response_token_logprobs, token_loss_and_logprobs
from memrl.train.policy import LoraSettings, PolicySpec, response_logprobs
from memrl.train.rows import split_across_ranks, token_budget_bins
from memrl.train.surrogate import surrogate_loss

# rows of very different lengths: (prompt length, response length)
SHAPES = [(3, 2), (57, 41), (11, 1), (29, 70)]


def make_rows(vocab: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randint(5, vocab, (p,), generator=g).tolist(), torch.randint(5, vocab, (r,), generator=g).tolist())
        for p, r in SHAPES
    ]


def loss_inputs(rows, aggregation):
    """Per-row old / ref / rollout log-probs and advantages, as flat tensors and as padded [B, T-1] tensors."""
    g = torch.Generator().manual_seed(1)
    flat = {k: torch.randn(sum(len(r) for _, r in rows), generator=g) * 0.1 - 3.0 for k in ("old", "ref", "rollout")}
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    width = max(len(p) + len(r) for p, r in rows)
    padded = {k: torch.zeros(len(rows), width - 1) for k in flat}
    mask = torch.zeros(len(rows), width - 1)
    offset = 0
    for i, (p, r) in enumerate(rows):
        for k in flat:
            padded[k][i, len(p) - 1 : len(p) - 1 + len(r)] = flat[k][offset : offset + len(r)]
        mask[i, len(p) - 1 : len(p) - 1 + len(r)] = 1.0
        offset += len(r)
    norm = float(mask.sum()) if aggregation == "token-mean" else float(len(rows))
    return flat, padded, adv, mask, norm


SURROGATE = {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.05, "tis_cap": 2.0}


def unchunked_loss(model, rows, aggregation) -> torch.Tensor:
    """Today's path: padded batch, logits over every position, one clipped_surrogate."""
    _, padded, adv, mask, norm = loss_inputs(rows, aggregation)
    width = mask.shape[1] + 1
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        attn[i, : len(p) + len(r)] = 1
    lp, _ = response_logprobs(model, ids, attn)
    # the old path's logits carry a small offset on padding positions the mask removes; the advantage of the
    # old/new ratio is what is compared here, so pi_old = pi_theta + a fixed perturbation on response tokens
    out = clipped_surrogate(
        lp,
        lp.detach() + padded["old"] + 3.0,
        adv,
        mask,
        aggregation=aggregation,
        ref_logprobs=lp.detach() + padded["ref"] + 3.0,
        rollout_logprobs=lp.detach() + padded["rollout"] + 3.0,
        normalizer=norm,
        **SURROGATE,
    )
    return out.loss


def chunked_loss(model, rows, aggregation, *, packed: bool, fused: bool, chunk: int = 7) -> torch.Tensor:
    """The trainer's path: packed rows (or one row per micro-batch), response positions only, chunks of ``chunk``."""
    flat, _, adv, _, norm = loss_inputs(rows, aggregation)
    head = model.get_output_embeddings()
    total = torch.zeros(())
    groups = [list(range(len(rows)))] if packed else [[i] for i in range(len(rows))]
    starts = [0]
    for _, r in rows:
        starts.append(starts[-1] + len(r))
    for ids in groups:
        batch = pack_rows([rows[i] for i in ids], "cpu")
        tokens = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in ids])
        with torch.no_grad():  # pi_theta before the update, to build the same perturbed pi_old as unchunked_loss
            base, _ = response_token_logprobs(
                packed_hidden_states(model, head, batch), head, batch.targets, chunk_tokens=chunk
            )
        lengths = torch.tensor(batch.response_lengths)[batch.token_row]
        adv_tok = adv[torch.tensor(ids)][batch.token_row]

        def token_loss(lp, sl, base=base, tokens=tokens, lengths=lengths, adv_tok=adv_tok):
            def shift(k):
                return base[sl] + flat[k][tokens][sl] + 3.0

            terms = surrogate_loss(
                lp,
                shift("old"),
                adv_tok[sl],
                lengths[sl],
                aggregation=aggregation,
                normalizer=norm,
                ref_logprobs=shift("ref"),
                rollout_logprobs=shift("rollout"),
                **SURROGATE,
            )
            return terms.weighted

        hidden = packed_hidden_states(model, head, batch)
        loss, _, _ = token_loss_and_logprobs(hidden, head, batch.targets, token_loss, chunk_tokens=chunk, fused=fused)
        total = total + loss
    return total


def grads_of(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-mean"])
def test_chunked_loss_and_gradients_equal_the_unchunked_path(tiny_model_dir: Path, aggregation: str) -> None:
    model = load_causal_lm(str(tiny_model_dir), dtype="float32")
    model.eval()  # no dropout, so both passes see the same function
    rows = make_rows(model.config.vocab_size)
    reference_loss = unchunked_loss(model, rows, aggregation)
    reference = grads_of(model, reference_loss)
    for packed in (True, False):
        for fused in (True, False):
            loss = chunked_loss(model, rows, aggregation, packed=packed, fused=fused)
            assert float(loss.detach()) == pytest.approx(float(reference_loss.detach()), abs=1e-5), (packed, fused)
            grads = grads_of(model, loss)
            assert grads.keys() == reference.keys()
            for name, g in grads.items():
                assert torch.allclose(g, reference[name], atol=1e-5, rtol=1e-4), (name, packed, fused)


def test_packed_logprobs_equal_per_row_logprobs(tiny_model_dir: Path) -> None:
    model = load_causal_lm(str(tiny_model_dir), dtype="float32").eval()
    rows = make_rows(model.config.vocab_size)
    head = model.get_output_embeddings()
    batch = pack_rows(rows, "cpu")
    with torch.no_grad():
        packed, entropy = response_token_logprobs(
            packed_hidden_states(model, head, batch), head, batch.targets, chunk_tokens=5, with_entropy=True
        )
        expected, expected_entropy = [], []
        for p, r in rows:
            ids = torch.tensor([p + r])
            lp, ent = response_logprobs(model, ids, torch.ones_like(ids), with_entropy=True)
            expected.append(lp[0, len(p) - 1 :])
            expected_entropy.append(ent[0, len(p) - 1 :])
    assert torch.allclose(packed, torch.cat(expected), atol=1e-5)
    assert entropy is not None and torch.allclose(entropy, torch.cat(expected_entropy), atol=1e-4)


def test_token_budget_bins_and_rank_shares() -> None:
    lengths = [90, 10, 40, 60, 30, 200]
    bins = token_budget_bins(list(range(6)), lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert [5] in bins  # longer than the budget: alone
    assert all(sum(lengths[i] for i in b) <= 100 for b in bins if len(b) > 1)
    assert len(bins) == 4  # 200 | 90+10 | 60+40 | 30
    shares = split_across_ranks(list(range(6)), lengths, 2)
    assert sorted(shares[0] + shares[1]) == list(range(6))
    assert abs(sum(lengths[i] for i in shares[0]) - sum(lengths[i] for i in shares[1])) <= 30


def test_token_budget_update_equals_one_micro_batch(tiny_model_dir: Path) -> None:
    from test_group_trainer import groups_for

    def one_step(**overrides) -> dict[str, float]:
        cfg = GroupTrainerConfig(**ONE_STEP, lr=1e-3, lora=LoraSettings(enabled=False), max_grad_norm=1e9, **overrides)
        trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
        groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "no", n_groups=3)
        return trainer.step(groups)

    one = one_step()
    budget = one_step(max_tokens_per_micro_batch=30, logit_chunk_tokens=3)
    assert budget["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
    assert budget["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    assert budget["entropy"] == pytest.approx(one["entropy"], rel=1e-5)
    checkpointed = one_step(max_tokens_per_micro_batch=30, gradient_checkpointing=True)
    assert checkpointed["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
    assert checkpointed["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)


def sft_adapter(base: Path, out: Path) -> Path:
    """A LoRA adapter whose weights differ from the base (as after SFT)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        load_causal_lm(str(base), dtype="float32"),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM"),
    )
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    model.save_pretrained(out, safe_serialization=True)
    return out


def test_kl_reference_of_a_lora_run_from_an_sft_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    from test_group_trainer import groups_for

    adapter = sft_adapter(tiny_model_dir, tmp_path / "sft")
    spec = PolicySpec(base=str(tiny_model_dir), adapter=str(adapter))
    kl = {}
    for reference in ("initial", "initial-adapter", "base"):
        cfg = GroupTrainerConfig(**ONE_STEP, lr=1e-3, kl_coef=0.1, kl_reference=reference, lora=LoraSettings(r=4))
        trainer = GroupTrainer(spec, cfg)
        kl[reference] = trainer.step(groups_for(trainer.tokenizer, "the red key is in drawer 5", "no"))["kl_ref"]
        if reference == "initial-adapter":  # the frozen second adapter stays out of the synced policy
            saved = Path(trainer.save_policy(str(tmp_path / "policy")))
            assert (saved / "adapter_model.safetensors").is_file() and not (saved / "reference").exists()
            assert not any(p.requires_grad for n, p in trainer.model.named_parameters() if ".reference." in n)
    assert abs(kl["initial"]) < 1e-6  # RL starts at the SFT model: no KL at the first step
    assert abs(kl["initial-adapter"]) < 1e-6
    assert kl["base"] > 1e-4  # the base without the SFT adapter is another model


def test_fused_head_under_bf16_autocast_matches_the_checkpointed_path() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 500, bias=False)
    hidden = torch.randn(20, 32, requires_grad=True)
    targets = torch.randint(0, 500, (20,))
    weights = torch.rand(20)

    def run(fused: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        head.zero_grad()
        hidden.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _, _ = token_loss_and_logprobs(
                hidden, head, targets, lambda lp, sl: -lp.exp() * weights[sl], chunk_tokens=6, fused=fused
            )
        loss.backward()
        return loss.detach(), hidden.grad.clone(), head.weight.grad.clone()

    fused, plain = run(True), run(False)
    for a, b in zip(fused, plain, strict=True):
        assert torch.isfinite(a).all() and torch.allclose(a.float(), b.float(), rtol=2e-2, atol=1e-3)
