from __future__ import annotations

import hashlib
from pathlib import Path

from memrl.rollout.models import TEXT_TAG_TOKENS, TinyModelSpec, build_tiny_model, load_causal_lm, load_tokenizer


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def test_same_seed_gives_byte_identical_files(tmp_path: Path) -> None:
    spec = TinyModelSpec(seed=3, layers=1, hidden=64)
    a = digest(build_tiny_model(tmp_path / "a", spec))
    b = digest(build_tiny_model(tmp_path / "b", spec))
    assert "model.safetensors" in a and "tokenizer.json" in a
    assert a == b
    c = digest(build_tiny_model(tmp_path / "c", TinyModelSpec(seed=4, layers=1, hidden=64)))
    assert c["model.safetensors"] != a["model.safetensors"]
    assert c["tokenizer.json"] == a["tokenizer.json"]


def test_tokenizer_chat_template_and_tags(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict):
        ids = ids["input_ids"]
    text = tok.decode(ids)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    for tag in [*TEXT_TAG_TOKENS, "<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag
    # Text tags survive decoding with skip_special_tokens (vLLM decodes that way); control tokens do not.
    tagged = tok.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(tagged, skip_special_tokens=True) == "<tool_call>x</tool_call>"
    assert tok.eos_token == "<|im_end|>"


def test_assistant_mask_from_template(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    out = tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "the answer"}],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    masked = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tok.decode(masked) == "the answer<|im_end|>"


def test_generates_with_transformers(tiny_model_dir: Path) -> None:
    import torch

    tok = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir)
    assert model.config.head_dim == 64 and model.config.model_type == "qwen3"
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "where is the key"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=6, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1]
