"""Outcome scorers: lexical metrics, the AMA-Bench yes/no judge rule, LoCoMo category scoring and judges."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from data.loaders import load_locomo
from launch.evaluate import make_scorer
from rewards.scorers import (
    JudgeItem,
    JudgeScorer,
    LexicalJudge,
    bleu1,
    exact_match,
    judge_score,
    lexical_scores,
    locomo_category,
    locomo_score,
    parse_locomo_judge,
    parse_yes_no,
    render_ama_judge,
    token_f1,
    verifier_outcome,
)
from rollout.engines.base import Completion, Engine, GenerationRequest, GenerationResult, Usage
from rollout.engines.scripted import ScriptedEngine
from rollout.harness import aggregate

FIXTURES = Path(__file__).parent / "fixtures"


def test_lexical_metrics_match_hand_values() -> None:
    assert exact_match("The Red Key.", "red key") == 1.0 and exact_match("red keys", "red key") == 0.0
    # pred "red key chest 4" vs gold "key in chest 4": common {key, chest, 4} = 3; P = 3/4, R = 3/4
    assert token_f1("the red key, chest 4", "key in chest 4") == pytest.approx(0.75)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0
    # 2 predicted tokens, both in the 4-token reference: precision 1, brevity penalty exp(1 - 4/2)
    assert bleu1("the red key", "red key in chest") == pytest.approx(math.exp(-1))
    assert bleu1("red key key", "red key") == pytest.approx(2 / 3)  # clipped counts, no brevity penalty
    scores = lexical_scores("drawer 5", ["chest 3", "drawer 5"])  # best of the alternatives
    assert scores == {"exact_match": 1.0, "f1": 1.0, "bleu1": 1.0}
    assert verifier_outcome(None) == 0.0 and verifier_outcome(1) == 1.0


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("yes", True),
        ("No.", False),
        ("YES", True),
        ("<think>the answer says yes</think>\nno", False),  # thinking is dropped
        ("no, wait: the reference agrees, so yes", True),  # the last one wins
        ("Yes. On reflection, no", False),
        ("yesterday nobody knew", None),  # whole words only
        ("The prediction is correct.", None),
        ("", None),
    ],
)
def test_ama_judge_parser_last_yes_or_no_wins(reply: str, expected: bool | None) -> None:
    assert parse_yes_no(reply) is expected


def test_ama_judge_falls_back_to_f1_when_the_reply_has_no_verdict() -> None:
    assert judge_score("yes", "anything", "red key") == (1.0, True)
    assert judge_score("no", "red key", "red key") == (0.0, True)
    score, parsed = judge_score("I cannot decide.", "the red key chest", "red key")
    assert not parsed and score == pytest.approx(token_f1("the red key chest", "red key")) and score == pytest.approx(
        0.8)


def test_ama_judge_prompt_and_the_offline_judge_through_an_engine() -> None:
    messages = render_ama_judge("Where is the key?", "chest 4", "in chest 4", task="find keys", task_type="textworld")
    text = messages[0].content
    assert 'Respond with ONLY "yes" or "no"' in text and "Reference Answer: chest 4" in text
    assert "Task Type: textworld" in text
    judge = JudgeScorer(ScriptedEngine(LexicalJudge()), "ama")
    verdicts = judge.score([JudgeItem("Where?", "chest 4", "it is in chest 4"), JudgeItem("Where?", "chest 4", "box")])
    assert [(v.score, v.parsed, v.reply) for v in verdicts] == [(1.0, True, "yes"), (0.0, True, "no")]


class _Fixed(Engine):
    name = "fixed"

    def __init__(self, reply: str) -> None:
        self.reply = reply

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult([1], [Completion([2], [], self.reply, "stop")], Usage(1, 1), "fixed")
                for _ in requests]


def test_judge_engine_garbage_falls_back_to_f1() -> None:
    (verdict,) = JudgeScorer(_Fixed("hmm, maybe"), "ama").score([JudgeItem("q", "red key", "red key in chest")])
    assert not verdict.parsed and verdict.score == pytest.approx(token_f1("red key in chest", "red key"))
    (verdict,) = JudgeScorer(_Fixed("???"), "locomo").score([JudgeItem("q", "Paris", "Paris")])
    assert not verdict.parsed and verdict.score == 1.0


def test_locomo_judge_parser() -> None:
    assert parse_locomo_judge('{"reasoning": "same city", "label": "CORRECT"}') is True
    assert parse_locomo_judge('```json\n{"reasoning": "no", "label": "WRONG"}\n```') is False
    assert parse_locomo_judge("The answer is WRONG") is False
    assert parse_locomo_judge("<think>CORRECT?</think> unsure") is None
    judge = JudgeScorer(ScriptedEngine(LexicalJudge()), "locomo")
    assert [v.score for v in judge.score([JudgeItem("q", "Paris", "in Paris"), JudgeItem("q", "Paris", "Rome")])] == [
        1.0, 0.0]


def test_locomo_category_scoring_on_a_fixture_matches_hand_computed_values() -> None:
    """The fixture's predictions, scored through the loader, the eval scorer and the per-category breakdown.

    Hand-computed (Porter stems, 'a an the and' and commas dropped):
    - single hop: 'She moved to Paris.' vs 'Paris': stems she move to pari / pari -> P 1/4, R 1 -> F1 0.4;
      'the cat' vs 'a dog' -> 0. Mean 0.2.
    - temporal: 'May 7, 2023' vs '7 May 2023' -> the same three tokens -> 1.0.
    - open domain: gold cut at ';' -> 'hiking'; 'camping and hiking' -> camp hike -> P 1/2, R 1 -> 2/3.
    - multi hop: gold parts painting | hiking, prediction hiking -> (0 + 1) / 2 = 0.5.
    - adversarial: 'Not mentioned in the conversation' -> 1; 'Paris' -> 0. Mean 0.5.
    """
    (episode,) = load_locomo(FIXTURES / "locomo_scoring.json")
    raw = json.loads((FIXTURES / "locomo_scoring.json").read_text())
    predictions = [qa["prediction"] for qa in raw[0]["qa"]]
    records = []
    for qa, prediction in zip(episode.qa_pairs, predictions, strict=True):
        records.append({"mode": "qa", "question": qa.question, "gold": qa.answer, "golds": [qa.answer],
                        "answer": prediction, "category": qa.metadata["category"], "system": "s", "model": "m",
                        "reasoner_tokens": {"spent": 0}, "memory_tokens_answer": {"prompt": 0, "completion": 0}})
    scorer = make_scorer(JudgeScorer(ScriptedEngine(LexicalJudge()), "ama"), None)
    for record, scores in zip(records, scorer(records), strict=True):
        record["scores"] = scores
    by_category = {row["category"]: row["locomo"] for row in aggregate(records, ("category",))}
    assert by_category == pytest.approx({4: 0.2, 2: 1.0, 3: 2 / 3, 1: 0.5, 5: 0.5})
    assert [round(r["scores"]["locomo"], 4) for r in records] == [0.4, 0.0, 1.0, 0.6667, 0.5, 1.0, 0.0]
    assert locomo_category("adversarial") == 5 and locomo_category("3") == 3 and locomo_category("x") is None
    with pytest.raises(ValueError):
        locomo_score("a", "b", 7)
