"""The quickstart's report: ``report.md`` plus PNG plots (reward and success over iterations, held-out success before
and after per horizon, reasoner tokens spent)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["expert_sentence", "export_sentence", "rl_sentence", "sampled_sentence", "write_report"]


def _plots(run_dir: Path, summary: dict[str, Any], history: list[dict[str, Any]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    its = [h["iteration"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(its, [h.get("reward_mean", float("nan")) for h in history], label="reward r(n) (mean over trained calls)")
    ax.plot(its, [h.get("success", float("nan")) for h in history], label="tree leaves solved")
    ax.set_xlabel("OAT-GRPO iteration")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Training rollouts")
    fig.tight_layout()
    fig.savefig(run_dir / "reward_success.png", dpi=110)
    plt.close(fig)
    names.append("reward_success.png")

    before, after = summary["eval_before"], summary["eval_after"]
    horizons = sorted(
        {k.split("/", 1)[1] for k in before if k.startswith("success/")},
        key=lambda h: int(h.split()[0]) if h.split()[0].isdigit() else 0,
    )
    if horizons:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        width = 0.2
        for i, (label, data, key) in enumerate(
            [
                ("SFT (sampled)", before, "success"),
                ("SFT + OAT-GRPO (sampled)", after, "success"),
                ("SFT (greedy)", before, "success_greedy"),
                ("SFT + OAT-GRPO (greedy)", after, "success_greedy"),
            ]
        ):
            xs = [j + (i - 1.5) * width for j in range(len(horizons))]
            ax.bar(xs, [data.get(f"{key}/{h}") or 0.0 for h in horizons], width, label=label)
        ax.set_xticks(range(len(horizons)), horizons)
        ax.set_xlabel("tour length before the question")
        ax.set_ylabel("held-out success")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title("Held-out success per horizon")
        fig.tight_layout()
        fig.savefig(run_dir / "success_per_horizon.png", dpi=110)
        plt.close(fig)
        names.append("success_per_horizon.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    cumulative, total = [], 0
    for h in history:
        total += h.get("reasoner_tokens", 0)
        cumulative.append(total)
    ax.plot(its, cumulative)
    ax.set_xlabel("OAT-GRPO iteration")
    ax.set_ylabel("reasoner tokens (cumulative)")
    ax.set_title("Reasoner tokens spent by tree rollouts (prefill not cached + generated)")
    fig.tight_layout()
    fig.savefig(run_dir / "tokens.png", dpi=110)
    plt.close(fig)
    names.append("tokens.png")
    return names


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _role_decoding(cfg: Any) -> str:
    """How the memory model decodes each role in the sampled evaluation, from ``cfg.memory.sampling``."""
    names = {"consolidate": "cues", "recall": "recall"}
    parts = []
    for role, sampling in cfg.memory.sampling.items():
        how = "greedy" if sampling.temperature == 0 else f"sampled at temperature {sampling.temperature:g}"
        parts.append(f"{names.get(role, role)} {how}")
    return ", ".join(parts)


def sampled_sentence(cfg: Any) -> str:
    """What the *sampled* column is, from the run's config (``eval_samples`` runs per task, or not run)."""
    if cfg.eval_samples == 0:
        return "*Sampled*: not run (`eval_samples: 0`), so that column reads n/a."
    runs = "one run" if cfg.eval_samples == 1 else f"the mean of {cfg.eval_samples} runs"
    return f"*Sampled*: the memory model as it is trained ({_role_decoding(cfg)}; {runs} per task)."


def _sam_style(cfg: Any) -> bool:
    """Whether the run's family is SAM-style (sized by horizons; its expert is SAM's oracle, which ``cfg.expert``
    configures in full): the config says so (``QuickstartConfig.sam_style``)."""
    return getattr(cfg, "sam_style", True)


def expert_sentence(cfg: Any) -> str:
    """What the privileged expert does with a fact a later page restates, from ``cfg.expert.defer_to_later``; for
    another family, that its own oracle is the expert (it takes only ``expert.error_rate`` from that section)."""
    if not _sam_style(cfg):
        return (
            f" The expert is the {cfg.task_family} family's own oracle, which sees the true state"
            " (`expert.defer_to_later` is SAM's and does not apply to it)."
        )
    defer = cfg.expert.defer_to_later
    if not defer:
        return (
            " The oracle sees the true state and writes every fact into its cues (`expert.defer_to_later: 0`),"
            " so the SFT data holds no habit the student cannot imitate."
        )
    return (
        " The oracle sees the true state and, when it knows a later page restates a fact, leaves the fact out"
        f" ({defer:.0%} of the time, `expert.defer_to_later`). That never costs the expert its answer, so these"
        " traces survive rejection sampling; the student cannot see the later page and learns to drop facts"
        " blindly."
    )


def export_sentence(export: dict[str, Any], base: str | None, sft: str | None) -> str:
    """The export line: where, verified or not, and what the weights were compared with (as the check did)."""
    verified = "verified" if export["ok"] else "FAILED: " + ", ".join(export["failures"])
    diff = export.get("differs_from_base")
    if diff is None:
        compared = "weights not compared with another model"
    else:
        against = {str(base): "the untrained base", str(sft): "the SFT model RL started from"}.get(
            str(diff["base"]), f"`{diff['base']}`"
        )
        compared = f"weights differ from {against}" if diff["differs"] else f"weights do NOT differ from {against}"
        compared += f" ({diff['tensors_changed']}/{diff['tensors_compared']} tensors changed)"
    return f"- Export: `{export['path']}` ({verified} in transformers and vLLM; {compared})."


def rl_sentence(cfg: Any, summary: dict[str, Any]) -> str:
    """The OAT-GRPO line: iterations, updates, where the trees branch, the reward as configured, tokens spent."""
    roles = " and ".join({"consolidate": "cue", "recall": "recall"}.get(r, r) for r in cfg.tree.branch_roles)
    weight = cfg.credit.weight_of("committee")
    reward = (
        f"r = V(n) + {weight:g} (c(n) - c_bar) with the oracle as committee and the offline judge"
        if weight
        else "r = V(n) (committee off)"
    )
    return (
        f"- OAT-GRPO: {summary['rl_iterations']} iterations, {summary['rl_updates']} optimizer updates, trees"
        f" with K={cfg.tree.branch_factor} siblings per {roles} (depth {cfg.tree.max_branch_depth}), reward"
        f" {reward}; {summary['reasoner_tokens_rl']:,} reasoner tokens spent."
    )


def write_report(run_dir: Path, cfg: Any, summary: dict[str, Any], history: list[dict[str, Any]]) -> Path:
    """Write ``report.md`` and the plots into ``run_dir``; returns the report path."""
    plots = _plots(run_dir, summary, history)
    before, after = summary["eval_before"], summary["eval_after"]
    rows = [(name, v["success"], v["success_greedy"]) for name, v in summary["baselines"].items()]
    rows += [
        ("SFT", summary["success_sft"], summary["success_sft_greedy"]),
        ("SFT + OAT-GRPO", summary["success_rl"], summary["success_rl_greedy"]),
    ]
    d = summary["distill"]
    lines = [
        "# memrl quickstart report",
        "",
        (
            "SmolLM2-135M-Instruct"
            if getattr(cfg, "base_model", "tiny") == "smollm2"
            else "A tiny random-initialised Qwen3 memory model"
        )
        + " learns SAM's two memory roles (cue writing, intent-driven recall)"
        f" from {'a privileged' if cfg.expert.defer_to_later or not _sam_style(cfg) else 'an'} oracle expert, then"
        " OAT-GRPO trains its"
        f" {' and '.join({'consolidate': 'cue writing'}.get(r, r) for r in cfg.tree.branch_roles)} inside SAM with a"
        f" frozen scripted reasoner (tasks: {getattr(cfg, 'task_family', 'sam')}).",
        "",
        "## Held-out success inside SAM",
        "",
        (
            f"{len(cfg.eval_horizons)} horizons x {cfg.eval_tasks_per_horizon} held-out tasks."
            if _sam_style(cfg)
            else f"{cfg.eval_tasks_per_horizon} held-out {cfg.task_family} tasks ({json.dumps(cfg.task_params)})."
        )
        + f" {sampled_sentence(cfg)}"
        " *Greedy*: every memory call decoded greedily.",
        "",
        "| memory model | success (sampled) | success (greedy) |",
        "|---|---|---|",
        *[f"| {n} | {_pct(s)} | {_pct(g)} |" for n, s, g in rows],
        "",
        "Per horizon:",
        "",
        "| horizon | SFT sampled | RL sampled | SFT greedy | RL greedy |",
        "|---|---|---|---|---|",
    ]
    for key in sorted(k for k in before if k.startswith("success/")):
        h = key.split("/", 1)[1]
        lines.append(
            f"| {h} | {_pct(before.get(key))} | {_pct(after.get(key))} | "
            f"{_pct(before.get('success_greedy/' + h))} | {_pct(after.get('success_greedy/' + h))} |"
        )
    if summary.get("paired"):
        lines += [
            "",
            "Greedy, paired over the same held-out tasks (95% bootstrap intervals over tasks):",
            "",
            "| model or difference | mean | 95% interval | tasks |",
            "|---|---|---|---|",
        ]
        for name, v in summary["paired"].items():
            lines.append(f"| {name} | {v['mean']:+.3f} | [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}] | {v['tasks']} |")
    lines += [
        "",
        "## What happened",
        "",
        f"- Distillation: {d['traces']['kept']} of {d['traces']['total']} expert trajectories kept by rejection"
        f" sampling ({d['rows']['kept']} SFT rows).{expert_sentence(cfg)}",
        rl_sentence(cfg, summary),
        f"- Reasoner tokens per task (prompt + generated): SFT {before['reasoner_tokens_per_task']:.0f}, after RL"
        f" {after['reasoner_tokens_per_task']:.0f}; memory-model tokens per task:"
        f" {before['memory_tokens_per_task']:.0f} -> {after['memory_tokens_per_task']:.0f}.",
    ]
    if summary.get("export"):
        lines.append(export_sentence(summary["export"], summary.get("base_model_dir"), summary.get("sft_model_dir")))
    lines += [
        f"- Wall time {summary['wall_s']:.0f} s (stages: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in summary["stage_s"].items())
        + f"); peak RSS {summary['peak_rss_gib']:.2f} GiB.",
        "",
        "## Plots",
        "",
        *[f"![{p}]({p})" for p in plots],
        "",
        "Files: `summary.json`, `stage_figures.json` (each stage's figures, written as the stage ended),"
        " `heldout_results.json` (the held-out figures"
        + (" the model card records" if summary.get("export") else "")
        + "), `metrics.jsonl` (one line per RL iteration and eval), `config.yaml` (the resolved config), `distill/`"
        " (SFT datasets + stats), `sft/` and `rl/` (stage runs, checkpoints, policy versions)"
        + (", `export/model` (the Hugging Face checkpoint and its model card)." if summary.get("export") else "."),
    ]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
