"""``memrl eval``: memory systems x memory models x datasets -> per-item results, breakdowns and a side-by-side report.

For every dataset, system and model the harness (:mod:`memrl.rollout.evaluation`) yields one record per item (a
question, or a task run); :mod:`memrl.rewards.scorers` scores it (exact match, token F1, BLEU-1, the AMA-Bench yes/no
judge with its F1 fallback, LoCoMo per-category scores and its CORRECT/WRONG judge, task success from the verifier) and
the record is appended to ``<run>/results.jsonl`` at once (fsynced). A rerun with ``--resume`` reads that file (a torn
last line from a killed process is cut off), skips every finished item by its key (dataset, episode, item, system,
model) and appends only the rest, so rows are never duplicated. ``report.md`` leads each dataset with the benchmark's
official metric (LoCoMo F1 by category, AMA-Bench judge accuracy by QA type, MemoryArena task success rate and progress
score), compares the methods side by side with tokens per question (reasoner and memory model), and breaks results down
by QA type, LoCoMo category and horizon (the generator's target length, else the conversation's length in tokens); every
mean carries its 95% bootstrap interval. ``summary.json`` holds the same numbers and ``per_question.tsv`` one sorted
line per question, to ``diff`` two runs. ``memrl eval --dry-run`` prints the files and endpoints a config needs and
stops.

Defaults run offline: the reasoner of QA datasets is the programmatic reader and the memory model is the extractive
scripted model (both in :mod:`memrl.rollout.evaluation`), the judge is the lexical stand-in
(:class:`memrl.rewards.scorers.LexicalJudge`); task datasets use their family's scripted agent and oracle expert. Any of
them can be an engine (vLLM / HF checkpoint, LoRA adapter, OpenAI-compatible endpoint).
"""
