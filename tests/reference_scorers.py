"""Reference scorers written, for the agreement tests, from the benchmarks' own evaluation code as published:
LoCoMo's ``task_eval/evaluation.py`` (``normalize_answer``, ``f1_score``, ``f1``, ``eval_question_answering``) and
``task_eval/gpt_utils.py`` (``get_cat_5_answer``), and AMA-Bench's ``utils/evaluation_metrics.py``
(``normalize_text``, ``compute_exact_match``, ``compute_f1_score``, ``compute_llm_as_judge``). They follow those
functions statement by statement, with the same libraries (``regex``, ``string.punctuation``, NLTK's Porter stemmer,
``numpy.mean``), and share no code with memrl."""

from __future__ import annotations

import re
import string
from collections import Counter

import numpy as np
import regex
from nltk.stem import PorterStemmer

_ps = PorterStemmer()


# LoCoMo -----------------------------------------------------------------------------------------------------------


def locomo_normalize_answer(s: str) -> str:
    s = s.replace(",", "")
    s = s.lower()
    exclude = set(string.punctuation)
    s = "".join(ch for ch in s if ch not in exclude)
    s = regex.sub(r"\b(a|an|the|and)\b", " ", s)
    return " ".join(s.split())


def locomo_f1_score(prediction: str, ground_truth: str) -> float:
    prediction_tokens = [_ps.stem(w) for w in locomo_normalize_answer(prediction).split()]
    ground_truth_tokens = [_ps.stem(w) for w in locomo_normalize_answer(ground_truth).split()]
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def locomo_multi_f1(prediction: str, ground_truth: str) -> float:
    predictions = [p.strip() for p in prediction.split(",")]
    ground_truths = [g.strip() for g in ground_truth.split(",")]
    return np.mean([max([locomo_f1_score(p, gt) for p in predictions]) for gt in ground_truths])


def locomo_eval_one(output: str, answer: str, category: int) -> float:
    """One row of ``eval_question_answering``."""
    answer = str(answer)
    if category == 3:
        answer = answer.split(";")[0].strip()
    if category in [2, 3, 4]:
        return locomo_f1_score(output, answer)
    if category in [1]:
        return locomo_multi_f1(output, answer)
    if category in [5]:
        return 1 if "no information available" in output.lower() or "not mentioned" in output.lower() else 0
    raise ValueError(category)


def locomo_cat5_answer(model_prediction: str, answer_key: dict[str, str]) -> str:
    """``get_cat_5_answer``."""
    model_prediction = model_prediction.strip().lower()
    if len(model_prediction) == 1:
        return answer_key["a"] if "a" in model_prediction else answer_key["b"]
    if len(model_prediction) == 3:
        return answer_key["a"] if "(a)" in model_prediction else answer_key["b"]
    return model_prediction


# AMA-Bench --------------------------------------------------------------------------------------------------------


def ama_normalize_text(text: str) -> str:
    text = text.lower()
    text = re.sub(r"[^\w\s]", " ", text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def ama_compute_exact_match(predicted: str, golden: str) -> float:
    return 1.0 if ama_normalize_text(predicted) == ama_normalize_text(golden) else 0.0


def ama_compute_f1_score(predicted: str, golden: str) -> float:
    pred_tokens = ama_normalize_text(predicted).split()
    gold_tokens = ama_normalize_text(golden).split()
    if not pred_tokens and not gold_tokens:
        return 1.0
    if not pred_tokens or not gold_tokens:
        return 0.0
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_common = sum(common.values())
    if num_common == 0:
        return 0.0
    precision = num_common / len(pred_tokens)
    recall = num_common / len(gold_tokens)
    return 2 * (precision * recall) / (precision + recall)


def ama_judge_prompt(
    question: str,
    golden_answer: str,
    predicted_answer: str,
    task_description: str = "",
    task_type: str = "",
    episode_id: str = "",
) -> str:
    context_parts = []
    if task_type:
        context_parts.append(f"Task Type: {task_type}")
    if episode_id:
        context_parts.append(f"Episode ID: {episode_id}")
    if task_description:
        context_parts.append(f"Task Context: {task_description}")
    context_str = "\n".join(context_parts) if context_parts else ""
    return f"""You are an expert evaluator. You will be given a question, a reference answer, and a predicted answer.
Your task is to determine if the predicted answer is correct based on:
1. Factual correctness compared to the reference
2. Completeness of the answer
3. Relevance to the question

{context_str}

Question: {question}

Reference Answer: {golden_answer}

Predicted Answer: {predicted_answer}

Is the predicted answer correct? Respond with ONLY "yes" or "no". Do not include any thinking process, explanation, or additional text.

Answer:<think></think>"""  # noqa: E501


def ama_judge_score(response: str, predicted_answer: str, golden_answer: str) -> float:
    """The parsing half of ``compute_llm_as_judge``."""
    response_cleaned = re.sub(r"<think>.*?</think>", "", response, flags=re.DOTALL | re.IGNORECASE).strip()
    response_lower = response_cleaned.lower()
    yes_matches = list(re.finditer(r"\byes\b", response_lower))
    no_matches = list(re.finditer(r"\bno\b", response_lower))
    last_yes_pos = yes_matches[-1].start() if yes_matches else -1
    last_no_pos = no_matches[-1].start() if no_matches else -1
    if last_yes_pos > last_no_pos:
        return 1.0
    if last_no_pos > last_yes_pos:
        return 0.0
    return ama_compute_f1_score(predicted_answer, golden_answer)
