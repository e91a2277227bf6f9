"""The evaluation harness: memory systems x memory models x datasets -> one record per item, with the answer,
the reasoner's and the memory model's tokens, and whatever the caller's scoring function adds.

One concept a module: :mod:`.records` (record keys and fields), :mod:`.text` (shared text helpers), :mod:`.reader`
(the programmatic reader and a question's evidence), :mod:`.extractive` (the extractive memory model), :mod:`.qa`
(question answering over recorded trajectories), :mod:`.tasks` (the task families, and
:func:`~memrl.rollout.evaluation.tasks.evaluate_sam_memory`), :mod:`.stats` (aggregation and intervals).

The harness never imports :mod:`memrl.rewards`: a ``scorer`` callable
(:data:`~memrl.rollout.evaluation.records.Scorer`) maps a batch of records to score dicts.
"""
