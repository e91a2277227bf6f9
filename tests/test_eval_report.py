"""``memrl eval``'s report says what happened (issue 41 item 6): per system the malformed-reply and failed-request
counts with a flag on a score that rests on them, the reasoner's reply format checked by one probe request up front,
a free-text answer fallback, a note where LoCoMo's adversarial category is scored by the reader's fallback phrase,
and token columns left out (with a note) when nothing counted tokens."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from memrl.launch.evaluation.config import EvalConfig
from memrl.launch.evaluation.run import evaluate, probe_reasoner_format
from memrl.rollout.engines.scripted import ScriptedEngine

FIXTURES = Path(__file__).parent / "fixtures"
SYSTEMS = [{"memory": {"name": "long_context"}}, {"memory": {"name": "bm25"}}]


class ProseReasoner:
    """A reasoner that answers in plain prose, never with the ``answer`` tool call (a small instruction model)."""

    name = "prose"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        return "I think the answer is the kitchen drawer."


def config(tmp_path: Path, tiny_model_dir: Path, name: str, **extra: Any) -> EvalConfig:
    return EvalConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path), "name": name},
            "datasets": [
                {
                    "name": "ama",
                    "kind": "ama_synthetic",
                    "envs": ["textworld"],
                    "target_tokens": [400],
                    "episodes_per_setting": 1,
                    "per_type": 1,
                }
            ],
            "systems": SYSTEMS,
            "tokenizer": str(tiny_model_dir),
            "episodes_per_batch": 1,
            "reasoner": {
                "backend": "scripted",
                "name": "prose-reasoner",
                "tokenizer": str(tiny_model_dir),
                "scripted_policy": "test_eval_report:ProseReasoner",
            },
            **extra,
        }
    )


def test_a_reasoner_that_never_answers_in_the_format_is_reported_per_system(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Acceptance 4: the probe warns up front, and report.md says per system that every question went unanswered
    because every reply was malformed, and that the score rests on it."""
    summary = evaluate(config(tmp_path, tiny_model_dir, "prose"), tmp_path / "prose")
    assert summary["reasoner_format"] == {"follows": False, "reply": "I think the answer is the kitchen drawer."}
    report = (tmp_path / "prose" / "report.md").read_text()
    assert "**Warning: the reasoner does not answer in the harness's format.**" in report
    assert "`I think the answer is the kitchen drawer.`" in report
    health = {h["system"]: h for h in summary["datasets"]["ama"]["health"]}
    assert set(health) == {"long_context", "bm25"}
    for system, h in health.items():
        assert h["items"] >= 4 and h["no_answer"] == h["items"] == h["malformed_items"]
        assert h["malformed_replies"] >= h["items"] and h["rests_on_failures"]
        assert (
            f"**{system} x scripted: the score rests on failures** ({h['items']} of {h['items']} items got no "
            f"answer; {h['items']} had reasoner replies without the `answer` tool call" in report
        )
        assert (
            f"| {system} | scripted | {h['items']} | {h['items']} | {h['malformed_replies']} ({h['items']}) |" in report
        )


def test_free_text_answers_take_the_prose_reply(tmp_path: Path, tiny_model_dir: Path) -> None:
    """With ``free_text_answers: true`` the prose reply is the answer (marked as such), nothing rests on failures."""
    summary = evaluate(config(tmp_path, tiny_model_dir, "free", free_text_answers=True), tmp_path / "free")
    for h in summary["datasets"]["ama"]["health"]:
        assert h["no_answer"] == 0 and h["free_text_answers"] == h["items"] and not h["rests_on_failures"]
    report = (tmp_path / "free" / "report.md").read_text()
    assert "Its plain-text replies are taken as answers (`free_text_answers: true`)." in report
    assert "the score rests on failures" not in report


def test_probe_passes_a_reasoner_that_answers_with_the_tool_call(tiny_model_dir: Path) -> None:
    from memrl.rollout.evaluation.reader import EvidenceReader

    reader = ScriptedEngine(EvidenceReader(), name="reader")  # answers 'not mentioned' with the answer tool call
    assert probe_reasoner_format(reader, free_text=False)["follows"] is True


def test_locomo_adversarial_fallback_note_and_hidden_token_columns(tmp_path: Path) -> None:
    """The programmatic reader's 'not mentioned' earns LoCoMo's adversarial point: the report says the category is
    scored by that fallback; with no tokenizer the token columns are left out with a note instead of reading 0."""
    cfg = EvalConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path), "name": "locomo"},
            "tokenizer": None,
            "locomo_judge": False,
            "datasets": [{"name": "locomo", "kind": "locomo", "path": str(FIXTURES / "locomo_small.json")}],
            "systems": SYSTEMS,
        }
    )
    summary = evaluate(cfg, tmp_path / "locomo")
    entry = summary["datasets"]["locomo"]
    assert entry["tokens_counted"] is False
    assert all(r["n"] == r["fallback"] == 1 for r in entry["adversarial_fallback"])
    report = (tmp_path / "locomo" / "report.md").read_text()
    assert "**Note: adversarial is scored by a fallback.**" in report
    assert "Answers that say so: long_context x scripted 1 of 1; bm25 x scripted 1 of 1." in report
    assert "reasoner tok/q" not in report and "Token columns are left out" in report
