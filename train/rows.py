"""Training rows: a group's samples flattened into rows (:class:`Row`: shared prompt ids + response ids, the group
advantage, the rollout engine's log-probs), and how rows are binned for an update: shared across processes by tokens
(:func:`split_across_ranks`) and packed into micro-batches under a token budget (:func:`token_budget_bins`).
"""

from __future__ import annotations

from dataclasses import dataclass

from memrl.data.schemas import Group

__all__ = ["Row", "advantage_shares", "rows_from_groups", "split_across_ranks", "token_budget_bins"]


@dataclass
class Row:
    """One training row: prompt + response token ids, the advantage, and the rollout engine's log-probs."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    rollout_logprobs: list[float]
    reward: float = 0.0
    policy_version: int = 0
    outcome_tied: bool = False  # from a group whose outcomes tie: only shaping set its advantage

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def rows_from_groups(groups: list[Group], *, skip_zero_advantage: bool = True) -> list[Row]:
    """Flatten groups into rows (zero-variance groups are dropped when ``skip_zero_advantage``)."""
    rows = []
    for group in groups:
        if skip_zero_advantage and all(s.advantage == 0.0 for s in group.samples):
            continue
        for s in group.samples:
            if not s.response_ids:
                continue
            rows.append(
                Row(
                    list(group.prompt_ids),
                    list(s.response_ids),
                    s.advantage,
                    list(s.rollout_logprobs),
                    s.reward,
                    s.policy_version,
                    bool(group.metadata.get("outcome_tied", False)),
                )
            )
    return rows


def advantage_shares(rows: list[Row]) -> dict[str, float]:
    """Where an update's advantage comes from, over the rows it trains:

    - ``outcome_tied_row_fraction`` / ``outcome_tied_advantage_fraction``: the share of rows, and of the total |A|,
      from groups whose outcomes tie (their advantage is set by shaping alone);
    - ``identical_row_fraction``: rows whose prompt and response equal another row's;
    - ``identical_row_cancelled_advantage_fraction``: the share of the total |A| that cancels on identical rows,
      1 - sum over distinct rows of |sum of their A| / sum of |A| (their gradients add up; their tokens still count
      in a token-mean loss)."""
    if not rows:
        return {}
    total = sum(abs(r.advantage) for r in rows)
    by_text: dict[tuple[tuple[int, ...], tuple[int, ...]], list[float]] = {}
    for r in rows:
        by_text.setdefault((tuple(r.prompt_ids), tuple(r.response_ids)), []).append(r.advantage)
    out = {
        "outcome_tied_row_fraction": sum(r.outcome_tied for r in rows) / len(rows),
        "identical_row_fraction": sum(len(a) for a in by_text.values() if len(a) > 1) / len(rows),
    }
    if total > 0:
        out["outcome_tied_advantage_fraction"] = sum(abs(r.advantage) for r in rows if r.outcome_tied) / total
        out["identical_row_cancelled_advantage_fraction"] = 1.0 - sum(abs(sum(a)) for a in by_text.values()) / total
    return out


def split_across_ranks(ids: list[int], lengths: list[int], world: int) -> list[list[int]]:
    """Rows ``ids`` shared among ``world`` processes, longest first to the process with the fewest tokens so far (the
    same answer on every process)."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(ids, key=lambda i: -lengths[i]):
        rank = min(range(world), key=lambda r: (load[r], r))
        shares[rank].append(i)
        load[rank] += lengths[i]
    return shares


def token_budget_bins(ids: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """First-fit-decreasing packing of rows into micro-batches of at most ``budget`` tokens (a longer row alone)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(ids, key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return bins
