"""Outcome scorers for answers (docs/architecture.md#rewards-and-scorers): normalised exact match, token F1,
BLEU-1, the AMA-Bench yes/no LLM judge, LoCoMo per-category scoring and its CORRECT/WRONG JSON judge, and
environment-verifier outcomes.

- **Lexical metrics** use SQuAD-style normalisation (:func:`memrl.data.tasks.common.normalize_answer`: lower case, no
  punctuation, no articles); with several gold answers (MemoryArena alternatives) the best one counts.
- **AMA-Bench judge** (AMA-Bench, arXiv 2602.22769, appendix C; ``compute_llm_as_judge`` of AMA-Bench's
  ``utils/evaluation_metrics.py``):
  the judge model gets the ``Task Type`` / ``Episode ID`` / ``Task Context`` lines, the question, the reference answer
  and the prediction, and must reply ``yes`` or ``no``; the prompt ends ``Answer:<think></think>``. Parsing:
  ``<think>...</think>`` blocks are removed, then the *last* whole-word ``yes`` or ``no`` (case-insensitive)
  decides; a reply with neither falls back to AMA-Bench's token F1 (:func:`ama_f1`: punctuation becomes a space,
  ``_`` stays, so ``turn-left`` equals ``turn left``). Accuracy counts scores equal to 1.0; the mean score is
  reported beside it.
- **LoCoMo** (its reference ``task_eval/evaluation.py``): normalisation drops commas, punctuation and the words
  ``a an the and``; tokens are Porter-stemmed. Categories 2 (temporal), 3 (open domain) and 4 (single hop) score the
  stemmed token F1 (category 3 against the part of the gold answer before the first ``;``); category 1 (multi hop)
  splits prediction and gold at commas and averages, over gold parts, the best F1 of any predicted part; category 5
  (adversarial) scores 1 when the prediction says ``no information available`` or ``not mentioned``, else 0; a reply
  naming an option of the adversarial question (``a``, ``(b)``) is that option's text first
  (:func:`locomo_option_answer`, the official ``get_cat_5_answer``).
- **LoCoMo judge** (the CORRECT/WRONG protocol of LLM-judged LoCoMo evaluations): the judge replies with JSON
  ``{"reasoning": ..., "label": "CORRECT" | "WRONG"}``; the parser reads the last JSON object with a ``label``, else
  the last bare CORRECT/WRONG word; neither gives None (the caller counts it and falls back to token F1).
- **Judges are engines** (:class:`JudgeScorer`): one batched ``generate`` per batch of items; any engine works, e.g.
  a vLLM or OpenAI-compatible judge model. :class:`LexicalJudge` is the offline stand-in behind the scripted backend
  (it answers both judge prompts by whether the normalised gold answer occurs in the prediction), so the judge path
  runs without a model.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import regex

from memrl.data.schemas import Message
from memrl.data.tasks.common import normalize_answer
from memrl.rollout.engines.base import Engine, EngineError, GenerationRequest, SamplingParams

log = logging.getLogger(__name__)

__all__ = [
    "AMA_JUDGE_MAX_TOKENS",
    "AMA_JUDGE_TEMPLATE",
    "LOCOMO_CATEGORY_NAMES",
    "LOCOMO_JUDGE_TEMPLATE",
    "JudgeItem",
    "JudgeScorer",
    "JudgeVerdict",
    "LexicalJudge",
    "ama_exact_match",
    "ama_f1",
    "ama_normalize",
    "best_of",
    "bleu1",
    "exact_match",
    "judge_score",
    "lexical_scores",
    "locomo_category",
    "locomo_f1",
    "locomo_multi_f1",
    "locomo_normalize",
    "locomo_option_answer",
    "locomo_score",
    "parse_locomo_judge",
    "parse_yes_no",
    "render_ama_judge",
    "render_locomo_judge",
    "token_f1",
    "verifier_outcome",
]


# ----------------------------------------------------------------------------------------------------------------
# Lexical metrics


def _tokens(text: str | None) -> list[str]:
    return normalize_answer(text).split()


def exact_match(prediction: str | None, gold: str) -> float:
    """1.0 when the normalised prediction equals the normalised gold answer, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str | None, gold: str) -> float:
    """Token F1 between normalised prediction and gold (both empty: 1.0; one empty: 0.0)."""
    return _f1_of_tokens(_tokens(prediction), _tokens(gold))


def _f1_of_tokens(pred: list[str], ref: list[str]) -> float:
    """Bag-of-tokens F1 (both empty: 1.0; one empty: 0.0)."""
    if not pred and not ref:
        return 1.0
    if not pred or not ref:
        return 0.0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def bleu1(prediction: str | None, gold: str) -> float:
    """Sentence BLEU-1: clipped unigram precision of the normalised prediction times the brevity penalty."""
    pred, ref = _tokens(prediction), _tokens(gold)
    if not pred or not ref:
        return float(not pred and not ref)
    clipped = sum((Counter(pred) & Counter(ref)).values())
    precision = clipped / len(pred)
    brevity = 1.0 if len(pred) > len(ref) else math.exp(1 - len(ref) / len(pred))
    return precision * brevity


def best_of(metric: Any, prediction: str | None, golds: Sequence[str]) -> float:
    """The best ``metric(prediction, gold)`` over several gold answers."""
    return max((metric(prediction, g) for g in golds), default=0.0)


def lexical_scores(prediction: str | None, golds: Sequence[str]) -> dict[str, float]:
    """Exact match, token F1 and BLEU-1 of a prediction against its gold answer(s)."""
    return {
        "exact_match": best_of(exact_match, prediction, golds),
        "f1": best_of(token_f1, prediction, golds),
        "bleu1": best_of(bleu1, prediction, golds),
    }


def verifier_outcome(outcome: float | None) -> float:
    """An environment verifier's outcome as a score (a run that never finished scores 0)."""
    return 0.0 if outcome is None else float(outcome)


# ----------------------------------------------------------------------------------------------------------------
# AMA-Bench yes/no judge

AMA_JUDGE_TEMPLATE = (
    "You are an expert evaluator. You will be given a question, a reference answer, and a predicted answer.\n"
    "Your task is to determine if the predicted answer is correct based on:\n"
    "1. Factual correctness compared to the reference\n"
    "2. Completeness of the answer\n"
    "3. Relevance to the question\n\n"
    "{context}\n\n"
    "Question: {question}\n\n"
    "Reference Answer: {reference}\n\n"
    "Predicted Answer: {predicted}\n\n"
    'Is the predicted answer correct? Respond with ONLY "yes" or "no". Do not include any thinking process, '
    "explanation, or additional text.\n\n"
    "Answer:<think></think>"
)
"""The AMA-Bench judge prompt (one user message), as ``compute_llm_as_judge`` of its ``utils/evaluation_metrics.py``
writes it: ``context`` holds the ``Task Type``, ``Episode ID`` and ``Task Context`` lines of the fields that are set,
and the trailing empty ``<think></think>`` turns a Qwen3 judge's thinking off."""

AMA_JUDGE_MAX_TOKENS = 2048
"""The official judge's token limit (``judge_client.query(..., max_tokens=2048)``)."""

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def render_ama_judge(
    question: str, reference: str, predicted: str, task: str = "", task_type: str = "", episode_id: str = ""
) -> list[Message]:
    """The AMA-Bench judge's messages for one answer."""
    context = "\n".join(
        line
        for line in (
            f"Task Type: {task_type}" if task_type else "",
            f"Episode ID: {episode_id}" if episode_id else "",
            f"Task Context: {task}" if task else "",
        )
        if line
    )
    text = AMA_JUDGE_TEMPLATE.format(context=context, question=question, reference=reference, predicted=predicted)
    return [Message(role="user", content=text)]


def parse_yes_no(text: str) -> bool | None:
    """AMA-Bench's rule: drop ``<think>`` blocks; the last whole-word ``yes``/``no`` wins; None without either."""
    body = _THINK.sub("", text or "").strip().lower()
    last_yes = max((m.start() for m in re.finditer(r"\byes\b", body)), default=-1)
    last_no = max((m.start() for m in re.finditer(r"\bno\b", body)), default=-1)
    if last_yes == last_no:
        return None
    return last_yes > last_no


def ama_normalize(text: str | None) -> str:
    """AMA-Bench's ``normalize_text``: lower case, every character that is not a word character or space becomes a
    space (so ``turn-left`` reads ``turn left``; ``_`` is a word character and stays), the articles ``a an the``
    go, whitespace collapses."""
    text = (text or "").lower()
    text = re.sub(r"[^\w\s]", " ", text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def ama_exact_match(prediction: str | None, gold: str) -> float:
    """AMA-Bench's ``compute_exact_match``: 1.0 when the normalised strings are equal."""
    return 1.0 if ama_normalize(prediction) == ama_normalize(gold) else 0.0


def ama_f1(prediction: str | None, gold: str) -> float:
    """AMA-Bench's ``compute_f1_score``: token F1 of the normalised strings (both empty: 1.0; one empty: 0.0)."""
    return _f1_of_tokens(ama_normalize(prediction).split(), ama_normalize(gold).split())


def judge_score(reply: str, prediction: str | None, gold: str) -> tuple[float, bool]:
    """(score, parsed): 1.0 / 0.0 from the judge's yes / no, else AMA-Bench's token F1 fallback with ``parsed``
    False."""
    verdict = parse_yes_no(reply)
    if verdict is None:
        return ama_f1(prediction, gold), False
    return float(verdict), True


# ----------------------------------------------------------------------------------------------------------------
# LoCoMo

LOCOMO_CATEGORY_NAMES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}
_LOCOMO_BY_NAME = {v: k for k, v in LOCOMO_CATEGORY_NAMES.items()}
_PUNCTUATION = set(string.punctuation)
_stemmer: Any = None


_LOCOMO_ARTICLES = regex.compile(r"\b(a|an|the|and)\b")


def locomo_normalize(text: str) -> str:
    """LoCoMo's ``normalize_answer``: drop commas, lower case, drop ``string.punctuation``, replace the words
    ``a an the and`` by spaces (with the ``regex`` module, as the official code), collapse whitespace."""
    text = "".join(ch for ch in text.replace(",", "").lower() if ch not in _PUNCTUATION)
    return " ".join(_LOCOMO_ARTICLES.sub(" ", text).split())


def _locomo_tokens(text: str) -> list[str]:
    global _stemmer
    if _stemmer is None:
        from nltk.stem import PorterStemmer

        _stemmer = PorterStemmer()
    return [_stemmer.stem(w) for w in locomo_normalize(text).split()]


def locomo_f1(prediction: str, gold: str) -> float:
    """LoCoMo's stemmed token F1 (0.0 when nothing is shared)."""
    pred, ref = _locomo_tokens(prediction), _locomo_tokens(gold)
    return _f1_of_tokens(pred, ref) if pred else 0.0  # LoCoMo: nothing predicted scores 0, even against nothing


def locomo_multi_f1(prediction: str, gold: str) -> float:
    """LoCoMo's multi-hop F1: mean over comma-separated gold parts of the best F1 of any comma-separated predicted
    part."""
    preds = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(locomo_f1(p, g) for p in preds) for g in golds) / len(golds)


def locomo_category(value: int | str | None) -> int | None:
    """The LoCoMo category number (1-5) from a number or a category name, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value in LOCOMO_CATEGORY_NAMES else None
    if isinstance(value, str):
        return int(value) if value.isdigit() and int(value) in LOCOMO_CATEGORY_NAMES else _LOCOMO_BY_NAME.get(value)
    return None


def locomo_option_answer(prediction: str, options: dict[str, str]) -> str:
    """LoCoMo's ``get_cat_5_answer``: an adversarial question offers options (a) and (b); a one-character reply
    (``a``) or a three-character one (``(a)``) becomes the option's text, anything else stays as it is (stripped and
    lower-cased)."""
    reply = prediction.strip().lower()
    if len(reply) == 1:
        return options["a"] if "a" in reply else options["b"]
    if len(reply) == 3:
        return options["a"] if "(a)" in reply else options["b"]
    return reply


def locomo_score(prediction: str | None, gold: str, category: int) -> float:
    """LoCoMo's per-category score of one prediction (see the module docstring)."""
    output = prediction or ""
    if category == 5:
        low = output.lower()
        return float("no information available" in low or "not mentioned" in low)
    if category == 1:
        return locomo_multi_f1(output, gold)
    if category == 3:
        gold = gold.split(";")[0].strip()
    if category in (2, 3, 4):
        return locomo_f1(output, gold)
    raise ValueError(f"LoCoMo category must be 1-5, got {category}")


LOCOMO_JUDGE_TEMPLATE = (
    "Your task is to label an answer to a question as 'CORRECT' or 'WRONG'. You will be given the following data:\n"
    "    (1) a question (posed by one user to another user),\n"
    "    (2) a 'gold' (ground truth) answer,\n"
    "    (3) a generated answer\n"
    "which you will score as CORRECT/WRONG.\n\n"
    "The gold answer will usually be a concise and short answer that includes the referenced topic. The generated "
    "answer might be much longer, but you should be generous with your grading - as long as it touches on the same "
    "topic as the gold answer, it should be counted as CORRECT. For time related questions, the gold answer will be "
    "a specific date, month, year, etc. The generated answer might be much longer or use relative time references, "
    "but you should be generous with your grading - as long as it refers to the same date or time period as the gold "
    "answer, it should be counted as CORRECT.\n\n"
    "Now it's time for the real question:\n"
    "Question: {question}\n"
    "Gold answer: {reference}\n"
    "Generated answer: {predicted}\n\n"
    "First, provide a short (one sentence) explanation of your reasoning, then finish with CORRECT or WRONG. Do NOT "
    "include both CORRECT and WRONG in your response, or it will break the evaluation script.\n\n"
    'Return the label in JSON format with the key as "label": {{"reasoning": "...", "label": "CORRECT"}}'
)


def render_locomo_judge(question: str, reference: str, predicted: str) -> list[Message]:
    """The LoCoMo CORRECT/WRONG judge's messages for one answer."""
    text = LOCOMO_JUDGE_TEMPLATE.format(question=question, reference=reference, predicted=predicted)
    return [Message(role="user", content=text)]


_JSON_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)


def parse_locomo_judge(text: str) -> bool | None:
    """True for CORRECT, False for WRONG: the last JSON object's ``label``, else the last bare label word."""
    body = _THINK.sub("", text or "")
    for raw in reversed(_JSON_OBJECT.findall(body)):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        label = obj.get("label") if isinstance(obj, dict) else None
        if isinstance(label, str) and label.strip().upper() in ("CORRECT", "WRONG"):
            return label.strip().upper() == "CORRECT"
    words = re.findall(r"\b(CORRECT|WRONG)\b", body.upper())
    return None if not words else words[-1] == "CORRECT"


# ----------------------------------------------------------------------------------------------------------------
# Judges through engines


@dataclass
class JudgeVerdict:
    """One judged answer: the score (1/0, or the F1 fallback), whether the reply parsed, the raw reply, and whether
    the judge's request failed after its retries (then the score is the F1 fallback too)."""

    score: float
    parsed: bool
    reply: str
    failed: bool = False


@dataclass
class JudgeItem:
    """What a judge needs to score one answer."""

    question: str
    reference: str
    predicted: str
    task: str = ""
    task_type: str = ""
    episode_id: str = ""


class JudgeScorer:
    """Score answers with a judge engine: ``protocol`` ``ama`` (yes/no) or ``locomo`` (CORRECT/WRONG JSON); one
    batched engine call per :meth:`score` call; unparsable replies fall back to token F1."""

    def __init__(self, engine: Engine, protocol: Literal["ama", "locomo"] = "ama", max_tokens: int = 64) -> None:
        self.engine = engine
        self.protocol = protocol
        self.max_tokens = max_tokens

    def _messages(self, item: JudgeItem) -> list[Message]:
        if self.protocol == "locomo":
            return render_locomo_judge(item.question, item.reference, item.predicted)
        return render_ama_judge(
            item.question, item.reference, item.predicted, item.task, item.task_type, item.episode_id
        )

    def score(self, items: Sequence[JudgeItem]) -> list[JudgeVerdict]:
        """A verdict per item (greedy decoding; the judge is never sampled). A judge request that fails after its
        retries costs its own item only: that verdict is the token-F1 fallback marked ``failed``."""
        if not items:
            return []
        requests = [
            GenerationRequest(
                messages=self._messages(item),
                sampling=SamplingParams(temperature=0.0, max_tokens=self.max_tokens, logprobs=False, seed=0),
                metadata={"role": f"judge_{self.protocol}"},
            )
            for item in items
        ]
        out = []
        for item, result in zip(items, self.engine.generate_each(requests), strict=True):
            if isinstance(result, EngineError):
                log.warning("judge request failed, scored by token F1 instead: %s", result)
                out.append(JudgeVerdict(token_f1(item.predicted, item.reference), False, "", failed=True))
                continue
            if isinstance(result, Exception):
                raise result
            reply = result.completions[0].text if result.completions else ""
            if self.protocol == "locomo":
                verdict = parse_locomo_judge(reply)
                if verdict is None:
                    out.append(JudgeVerdict(token_f1(item.predicted, item.reference), False, reply))
                else:
                    out.append(JudgeVerdict(float(verdict), True, reply))
            else:
                score, parsed = judge_score(reply, item.predicted, item.reference)
                out.append(JudgeVerdict(score, parsed, reply))
        return out


_AMA_FIELDS = re.compile(
    r"Question: (.*?)\n\nReference Answer: (.*?)\n\nPredicted Answer: (.*?)\n\nIs the predicted", re.DOTALL
)
_LOCOMO_FIELDS = re.compile(
    r"Question: (.*?)\nGold answer: (.*?)\nGenerated answer: (.*?)\n\nFirst, provide", re.DOTALL
)


class LexicalJudge:
    """Offline judge (a :class:`~memrl.data.schemas.ScriptedPolicy`): correct when every token of the normalised
    reference occurs, in order, in the normalised prediction. Answers the AMA-Bench prompt with ``yes``/``no`` and the
    LoCoMo
    prompt with its JSON label; any other prompt gets an empty reply."""

    name = "lexical-judge"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """The verdict for the judge prompt in the last message."""
        text = messages[-1]["content"] if isinstance(messages[-1], dict) else messages[-1].content
        if m := _AMA_FIELDS.search(text):
            return "yes" if self.correct(m.group(3), m.group(2)) else "no"
        if m := _LOCOMO_FIELDS.search(text):
            label = "CORRECT" if self.correct(m.group(3), m.group(2)) else "WRONG"
            return json.dumps({"reasoning": "lexical match of the gold answer", "label": label})
        return ""

    @staticmethod
    def correct(predicted: str, reference: str) -> bool:
        """Whether the normalised reference occurs as a whole-token span of the normalised prediction."""
        ref, pred = normalize_answer(reference), normalize_answer(predicted)
        return bool(ref) and f" {ref} " in f" {pred} "
