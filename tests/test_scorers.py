"""Outcome scorers: lexical metrics, the AMA-Bench yes/no judge rule, LoCoMo category scoring and judges."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fakes import RecordingEngine

from memrl.data.loaders import load_locomo
from memrl.launch.evaluation.engines import make_scorer
from memrl.rewards.scorers import (
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
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.evaluation.stats import aggregate

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
    assert (
        not parsed and score == pytest.approx(token_f1("the red key chest", "red key")) and score == pytest.approx(0.8)
    )


def test_ama_judge_prompt_and_the_offline_judge_through_an_engine() -> None:
    messages = render_ama_judge("Where is the key?", "chest 4", "in chest 4", task="find keys", task_type="textworld")
    text = messages[0].content
    assert 'Respond with ONLY "yes" or "no"' in text and "Reference Answer: chest 4" in text
    assert "Task Type: textworld" in text
    judge = JudgeScorer(ScriptedEngine(LexicalJudge()), "ama")
    verdicts = judge.score([JudgeItem("Where?", "chest 4", "it is in chest 4"), JudgeItem("Where?", "chest 4", "box")])
    assert [(v.score, v.parsed, v.reply) for v in verdicts] == [(1.0, True, "yes"), (0.0, True, "no")]


def test_judge_engine_garbage_falls_back_to_f1() -> None:
    garbage = RecordingEngine("hmm, maybe", "judge")
    (verdict,) = JudgeScorer(garbage, "ama").score([JudgeItem("q", "red key", "red key in chest")])
    assert not verdict.parsed and verdict.score == pytest.approx(token_f1("red key in chest", "red key"))
    (verdict,) = JudgeScorer(RecordingEngine("???", "judge"), "locomo").score([JudgeItem("q", "Paris", "Paris")])
    assert not verdict.parsed and verdict.score == 1.0


def test_locomo_judge_parser() -> None:
    assert parse_locomo_judge('{"reasoning": "same city", "label": "CORRECT"}') is True
    assert parse_locomo_judge('```json\n{"reasoning": "no", "label": "WRONG"}\n```') is False
    assert parse_locomo_judge("The answer is WRONG") is False
    assert parse_locomo_judge("<think>CORRECT?</think> unsure") is None
    judge = JudgeScorer(ScriptedEngine(LexicalJudge()), "locomo")
    assert [v.score for v in judge.score([JudgeItem("q", "Paris", "in Paris"), JudgeItem("q", "Paris", "Rome")])] == [
        1.0,
        0.0,
    ]


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
        records.append(
            {
                "mode": "qa",
                "question": qa.question,
                "gold": qa.answer,
                "golds": [qa.answer],
                "answer": prediction,
                "category": qa.metadata["category"],
                "system": "s",
                "model": "m",
                "reasoner_tokens": {"spent": 0},
                "memory_tokens_answer": {"prompt": 0, "completion": 0},
            }
        )
    scorer = make_scorer(JudgeScorer(ScriptedEngine(LexicalJudge()), "ama"), None)
    for record, scores in zip(records, scorer(records), strict=True):
        record["scores"] = scores
    by_category = {row["category"]: row["locomo"] for row in aggregate(records, ("category",))}
    assert by_category == pytest.approx({4: 0.2, 2: 1.0, 3: 2 / 3, 1: 0.5, 5: 0.5})
    assert [round(r["scores"]["locomo"], 4) for r in records] == [0.4, 0.0, 1.0, 0.6667, 0.5, 1.0, 0.0]
    assert locomo_category("adversarial") == 5 and locomo_category("3") == 3 and locomo_category("x") is None
    with pytest.raises(ValueError):
        locomo_score("a", "b", 7)


# ----------------------------------------------------------------------------------------------------------------
# Agreement with reference implementations written from the benchmarks' own code (tests/reference_scorers.py)

_GOLDS = [
    "7 May 2023",
    "a lake sunrise",
    "Sweden, pottery class",
    "mental health; charity",
    "3",
    "3.5",
    "turn-left",
    "turn_left",
    "The Brass Key",
    "adoption agencies",
    "",
    "New York, Boston, and Chicago",
    "running; hiking",
    "Not mentioned in the conversation",
    "the 2nd of June",
]
_VARIANTS = [
    lambda g: g,
    lambda g: g.upper(),
    lambda g: g.lower() + ".",
    lambda g: f"The {g}!",
    lambda g: g.replace("-", " "),
    lambda g: g.replace(" ", "_"),
    lambda g: g.replace(",", " and"),
    lambda g: f"I think it was {g}, maybe",
    lambda g: "",
    lambda g: "not mentioned in my context",
    lambda g: "42",
    lambda g: f"{g}s",
    lambda g: "(a)",
    lambda g: "b",
    lambda g: "An answer: " + g.replace(";", ","),
]


def _triples() -> list[tuple[str, str, int]]:
    return [(variant(gold), gold, category) for gold in _GOLDS for variant in _VARIANTS for category in (1, 2, 3, 4, 5)]


def test_locomo_scores_agree_exactly_with_the_reference() -> None:
    import reference_scorers as ref

    from memrl.rewards.scorers import locomo_normalize, locomo_option_answer

    triples = _triples()
    assert len(triples) >= 200
    options = {"a": "Not mentioned in the conversation", "b": "a lake sunrise"}
    for prediction, gold, category in triples:
        assert locomo_normalize(prediction) == ref.locomo_normalize_answer(prediction)
        ours, theirs = locomo_score(prediction, gold, category), ref.locomo_eval_one(prediction, gold, category)
        assert ours == theirs and type(ours) is float, (prediction, gold, category, ours, theirs)
        assert locomo_option_answer(prediction, options) == ref.locomo_cat5_answer(prediction, options)
    # and through the eval scorer (records as the harness writes them), category 5 options mapped first
    records = [
        {"mode": "qa", "question": "q", "answer": p, "gold": g, "golds": [g], "category": c, "options": options}
        for p, g, c in triples
    ]
    ama = JudgeScorer(ScriptedEngine(LexicalJudge()), "ama")
    for (prediction, gold, category), scores in zip(triples, make_scorer(ama, None)(records), strict=True):
        mapped = ref.locomo_cat5_answer(prediction, options) if category == 5 else prediction
        assert scores["locomo"] == ref.locomo_eval_one(mapped, gold, category)


def test_amabench_scores_agree_exactly_with_the_reference() -> None:
    import reference_scorers as ref

    from memrl.rewards.scorers import ama_exact_match, ama_f1, ama_normalize

    triples = _triples()
    replies = [
        "yes",
        "No.",
        "<think>no, wait</think>Yes",
        "yes... actually no",
        "maybe",
        "",
        "YES!",
        "nope",
        "The answer is not right: no",
        "<think>yes</think>",
    ]
    assert ama_f1("turn-left", "turn left") == 1.0 and ama_exact_match("turn_left", "turn left") == 0.0
    for i, (prediction, gold, _) in enumerate(triples):
        assert ama_normalize(prediction) == ref.ama_normalize_text(prediction)
        assert ama_exact_match(prediction, gold) == ref.ama_compute_exact_match(prediction, gold)
        assert ama_f1(prediction, gold) == ref.ama_compute_f1_score(prediction, gold)
        reply = replies[i % len(replies)]
        assert judge_score(reply, prediction, gold)[0] == ref.ama_judge_score(reply, prediction, gold)


@pytest.mark.parametrize(
    ("task", "task_type", "episode_id"),
    [("Find the key.", "textworld", "3"), ("", "", ""), ("Book a table.", "unknown", "")],
)
def test_ama_judge_prompt_is_the_official_one(task: str, task_type: str, episode_id: str) -> None:
    import reference_scorers as ref

    (message,) = render_ama_judge(
        "What did the agent take?", "['key', 'chest']", "the key", task, task_type, episode_id
    )
    assert message.content == ref.ama_judge_prompt(
        "What did the agent take?", "['key', 'chest']", "the key", task, task_type, episode_id
    )
    assert message.content.endswith("Answer:<think></think>")
