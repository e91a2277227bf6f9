"""Tiny random models of the recipes' architectures, built in memory for the GPU suite (no checkpoint on disk)."""

from __future__ import annotations

import torch

from memrl.launch.plan import MODEL_SHAPES

SHAPE = MODEL_SHAPES["tiny-gqa"]
VOCAB = SHAPE.vocab
# (prompt, response) lengths of very different sizes: a long prompt, one-token prompt and response, a long response.
ROW_LENGTHS = [(700, 40), (3, 1), (150, 260), (1, 30), (60, 5)]


def random_rows(seed: int = 0, lengths: list[tuple[int, int]] = ROW_LENGTHS) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) pairs of ``lengths`` with random tokens."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(3, VOCAB, (p,), generator=g).tolist(), torch.randint(3, VOCAB, (r,), generator=g).tolist())
        for p, r in lengths
    ]


def tiny_causal_lm(arch: str, attn_implementation: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A random 2-4 layer model of the ``tiny-gqa`` shape: ``qwen3`` (the dense layout ``memrl plan`` assumes) or
    ``qwen3_5`` (Qwen3.5's hybrid of gated-delta-net linear attention and full attention, the recipes' real base), in
    eval mode."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    common = SHAPE.to_hf_config() | {"max_position_embeddings": 2048}
    if arch == "qwen3":
        config = Qwen3Config(**common)
    elif arch == "qwen3_5":
        from transformers import Qwen3_5TextConfig  # only here: an older transformers lacks it, Qwen3 tests still run

        config = Qwen3_5TextConfig(
            **common | {"num_hidden_layers": 4},
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
        )
    else:
        raise ValueError(f"unknown arch {arch!r}")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.to(device=device, dtype=dtype).eval()


def padded_batch(rows: list[tuple[list[int], list[int]]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of ``rows`` right-padded to the longest."""
    longest = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r, device=device)
        mask[i, : len(p) + len(r)] = 1
    return ids, mask


def padded_logprobs(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """Per row, the log-probs of its response tokens from one right-padded batch with an attention mask and the full
    [rows, length, vocab] logits: the reference the packed, response-only path must equal."""
    device = next(model.parameters()).device
    ids, mask = padded_batch(rows, device)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    out = []
    for i, (p, r) in enumerate(rows):
        lp = logits[i, len(p) - 1 : len(p) - 1 + len(r)].log_softmax(-1)
        out.append(lp.gather(-1, torch.tensor(r, device=device).unsqueeze(-1)).squeeze(-1))
    return out
