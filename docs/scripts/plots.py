"""The results pages' plots, drawn from the JSON committed in ``docs/figures/``.

The documentation build calls :func:`render_all` (``docs/hooks.py``) and serves each plot as
``figures/plots/<name>.svg`` without writing it to the source tree, so a plot cannot drift from the data it shows.
The SVG text is deterministic (no date, fixed ids): the same JSON gives the same bytes.

    python docs/scripts/plots.py --out DIR      # write every plot to DIR, to look at them outside the site
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

FIGURES = Path(__file__).resolve().parents[1] / "figures"
BLUE, ORANGE, GREY, GREEN, RED = "#3949ab", "#ef6c00", "#7f8590", "#2e7d32", "#c62828"
PLOTS: dict[str, Callable[[], Any]] = {}


def plot(name: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Register a function that returns a matplotlib figure as the plot ``name`` (``figures/plots/<name>.svg``)."""

    def register(fn: Callable[[], Any]) -> Callable[[], Any]:
        PLOTS[name] = fn
        return fn

    return register


def load(name: str) -> dict[str, Any]:
    """A committed result file of ``docs/figures``."""
    return json.loads((FIGURES / name).read_text(encoding="utf-8"))


def forest(ax: Any, rows: list[tuple[str, float, tuple[float, float]]], *, colour: str = BLUE, unit: str = "") -> None:
    """Horizontal point-and-interval rows, first row on top, a zero line, and the values written beside them."""
    for i, (_label, mean, (low, high)) in enumerate(rows):
        y = len(rows) - 1 - i
        c = colour if low > 0 else RED if high < 0 else GREY  # an interval that excludes 0 has the colour of its sign
        ax.plot([low, high], [y, y], color=c, linewidth=2.2, solid_capstyle="butt")
        ax.plot([mean], [y], "o", color=c, markersize=6)
        ax.annotate(f"{mean:+.1f}{unit} [{low:+.1f}, {high:+.1f}]", (high, y), xytext=(6, -3.5),
                    textcoords="offset points", fontsize=8, color=c)  # fmt: skip
    ax.axvline(0, color="#444", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)], fontsize=9)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.grid(axis="x", color="#ddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def widen_for_labels(ax: Any, rows: list[tuple[str, float, tuple[float, float]]]) -> None:
    """Room on the right of the widest interval for its printed value."""
    low = min(min(r[2][0] for r in rows), 0.0)
    high = max(max(r[2][1] for r in rows), 0.0)
    ax.set_xlim(low - 0.05 * (high - low + 1), high + 0.6 * (high - low + 1))


def points(interval: dict[str, Any], scale: float = 100.0) -> tuple[float, tuple[float, float]]:
    """(mean, (low, high)) in points from a paired record (``difference``/``mean`` and ``ci95``/``interval``)."""
    mean = interval.get("difference", interval.get("mean"))
    low, high = interval.get("ci95", interval.get("interval"))
    return mean * scale if scale != 1 else mean, (low * scale, high * scale) if scale != 1 else (low, high)


def finish(fig: Any, *axes: Any) -> Any:
    """``fig`` laid out tight, the top and right frame lines of ``axes`` hidden."""
    for ax in axes:
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def paired_barh(ax: Any, series: list[tuple[list[float], list[str], str, str]]) -> None:
    """Two horizontal bars per row, side by side: each series (values, the text beside each bar, colour, label)."""
    width = 0.38
    for i, (values, texts, colour, label) in enumerate(series):
        ys = [y + (i - 0.5) * width for y in range(len(values))]
        ax.barh(ys, values, width, color=colour, label=label)
        for y, v, text in zip(ys, values, texts, strict=True):
            ax.annotate(text, (v, y), xytext=(3, -3), textcoords="offset points", fontsize=8)


# ----------------------------------------------------------------------------------------------------------------------
# Learning evidence: OAT-GRPO
@plot("learning_paired")
def learning_paired() -> Any:
    """OAT-GRPO against its start and its ablations, both settings, sampled and greedy (two-level intervals)."""
    pairs = [
        ("oat - sft", "OAT-GRPO − SFT start"),
        ("oat - sft_more", "OAT-GRPO − more SFT"),
        ("oat - flat", "OAT-GRPO − flat GRPO"),
        ("oat - tree_lambda0", "OAT-GRPO − no committee"),
    ]
    settings = [("ablations_deferring_full.json", "deferring_expert"), ("ablations_full.json", "multihop")]
    fig, axes = plt.subplots(2, 2, figsize=(10, 4.6))
    for col, mode in enumerate(("sampled", "greedy")):
        for row, (file, setting) in enumerate(settings):
            paired = load(file)["paired"]
            # these records are already in points
            rows = [(label, *points(paired[key][mode], scale=1)) for key, label in pairs]
            ax = axes[row][col]
            forest(ax, rows)
            widen_for_labels(ax, rows)
            ax.set_title(f"{setting}, {mode}", fontsize=10, loc="left")
            if col == 1:
                ax.set_yticklabels([])
    for ax in axes[1]:
        ax.set_xlabel("paired difference (points), 95% two-level interval", fontsize=8)
    return finish(fig)


@plot("credit_accuracy")
def credit_accuracy() -> Any:
    """Sign agreement of each credit method's advantages with replayed ground truth, per branching factor K."""
    data = load("credit_accuracy.json")["by_k"]
    methods = [("tree", "tree credit (λ = 0)", BLUE), ("oat", "OAT (λ = 0.5)", GREEN), ("flat", "flat GRPO", ORANGE),
               ("committee", "committee alone", GREY)]  # fmt: skip
    ks = sorted(data, key=lambda k: int(k.split("=")[1]))
    fig, ax = plt.subplots(figsize=(8, 3.2))
    width = 0.2
    for m, (key, label, colour) in enumerate(methods):
        xs = [i + (m - 1.5) * width for i in range(len(ks))]
        values = [data[k][key]["sign_agreement"]["value"] for k in ks]
        lows = [v - data[k][key]["sign_agreement"]["ci95"][0] for k, v in zip(ks, values, strict=True)]
        highs = [data[k][key]["sign_agreement"]["ci95"][1] - v for k, v in zip(ks, values, strict=True)]
        ax.bar(xs, values, width, label=label, color=colour, yerr=[lows, highs], capsize=2,
               error_kw={"linewidth": 0.8})  # fmt: skip
    ax.axhline(0.5, color="#444", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(ks)), [f"K = {k.split('=')[1]}" for k in ks])
    ax.set_ylabel("sign agreement with the truth")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return finish(fig, ax)


# ----------------------------------------------------------------------------------------------------------------------
# Learning evidence: pivot-turn GRPO
@plot("pivot_paired")
def pivot_paired() -> Any:
    """Pivot groups and all-turn groups against no RL, per number of fatal pivots F (two-level intervals)."""
    data = load("pivot_learning_full.json")["by_fatal_pivots"]
    pairs = [("pivot-no_rl", "pivot groups − no RL"), ("all_turns-no_rl", "all-turn groups − no RL")]
    rows = []
    for f in sorted(data, key=int):
        for key, label in pairs:
            rows.append((f"F = {f}: {label}", *points(data[f]["paired_deltas_pass_rate"][key])))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    forest(ax, rows)
    widen_for_labels(ax, rows)
    ax.set_xlabel("paired difference in test pass rate (points), 95% two-level interval", fontsize=8)
    return finish(fig)


# ----------------------------------------------------------------------------------------------------------------------
# TextWorld
TEXTWORLD_VARIANTS = [
    ("no_memory", "no memory"),
    ("bm25", "BM25"),
    ("long_context", "long context"),
    ("sam_sft", "SAM + SFT"),
    ("sam_oat", "SAM + OAT-GRPO"),
    ("sam_expert", "SAM + expert"),
]


@plot("textworld_success")
def textworld_success() -> Any:
    """Success per memory system on the same TextWorld games, the tiny model and SmolLM2 as the memory model."""
    runs = [("textworld_tiny_powered.json", "tiny model, 840 games × 3 seeds"),
            ("textworld_smollm2_powered.json", "SmolLM2-135M, 120 games × 3 seeds")]  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
    for ax, (file, title) in zip(axes, runs, strict=True):
        table = load(file)["table"]
        names = [(k, label) for k, label in TEXTWORLD_VARIANTS if k in table]
        values = [100 * table[k]["all"]["success"] for k, _ in names]
        colours = [BLUE if k.startswith("sam_") and k != "sam_expert" else GREY for k, _ in names]
        ax.barh(range(len(names)), values, color=colours)
        for y, v in enumerate(values):
            ax.annotate(f"{v:.1f}%", (v, y), xytext=(3, -3.5), textcoords="offset points", fontsize=8)
        ax.set_yticks(range(len(names)), [label for _, label in names], fontsize=9)
        ax.invert_yaxis()
        ax.set_xlim(0, 115)
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_xlabel("games won (%)")
    return finish(fig, *axes)


@plot("textworld_premise")
def textworld_premise() -> Any:
    """Games won against the reasoner's tokens per game, per memory system, on the large cells (each draw a point)."""
    run = load("textworld_premise.json")
    points = (
        run["finished_so_far"]
        if not run["complete"]
        else {k: {"all": {**v["all"], "games": v["all"]["games"] * v["all"]["draws"]}} for k, v in run["table"].items()}
    )
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for k, label in TEXTWORLD_VARIANTS:
        draws = points.get(k, {})
        for draw, entry in sorted(draws.items()):
            won, tokens = 100 * entry["success"], entry["reasoner_tokens_per_game"] / 1000
            colour = BLUE if k.startswith("sam_") and k != "sam_expert" else GREEN if k == "sam_expert" else GREY
            seed = draw.replace("sft", "SFT seed ").replace("/rl", ", RL seed ") if "/" in draw else f"seed {draw[3:]}"
            name = f"{label}, {seed}" if len(draws) > 1 else label  # a stopped run: one point per training draw
            ax.plot([tokens], [won], "o", color=colour, markersize=7)
            ax.annotate(f"{name} ({entry['games']} games)", (tokens, won), xytext=(6, -3.5),
                        textcoords="offset points", fontsize=8, color=colour)  # fmt: skip
    ax.set_xlabel("reasoner tokens per game (thousands, SmolLM2's tokenizer)")
    ax.set_ylabel("games won (%)")
    ax.set_ylim(-5, 105)
    most = max((e["reasoner_tokens_per_game"] for draws in points.values() for e in draws.values()), default=1000)
    ax.set_xlim(0, most / 1000 * 1.45)  # room for the rightmost point's label
    ax.grid(color="#ddd", linewidth=0.6)
    ax.set_axisbelow(True)
    return finish(fig, ax)


# ----------------------------------------------------------------------------------------------------------------------
# Quickstart
@plot("quickstart_success")
def quickstart_success() -> Any:
    """The quickstart's held-out success per memory model, recall sampled and greedy (its ``summary.json``)."""
    summary = load("quickstart.json")
    rows = [(name, v["success"], v["success_greedy"]) for name, v in summary["baselines"].items()]
    rows += [("SFT", summary["success_sft"], summary["success_sft_greedy"]),
             ("SFT + OAT-GRPO", summary["success_rl"], summary["success_rl_greedy"])]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 2.8))
    series = []
    for i, (mode, colour) in enumerate((("sampled", ORANGE), ("greedy", BLUE))):
        values = [row[1 + i] for row in rows]
        texts = ["n/a" if v is None else f"{100 * v:.1f}%" for v in values]
        series.append(([100 * v if v else 0.0 for v in values], texts, colour, f"recall {mode}"))
    paired_barh(ax, series)
    ax.set_yticks(range(len(rows)), [row[0] for row in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, 112)
    ax.set_xlabel("held-out success (%)")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return finish(fig, ax)


# ----------------------------------------------------------------------------------------------------------------------
# Speed
@plot("gpu_trainer")
def gpu_trainer() -> Any:
    """Tokens per second of memrl's trainer and the padded reference on one GPU, per workload."""
    data = load("gpu_h200.json")
    lines = [line for key in ("bench_lora_contexts", "bench_lora_16k_vs_reference") for line in data[key]["lines"]]
    measured = [line for line in lines if line.get("impl") and line.get("tokens_per_s")]
    best: dict[tuple[str, str], float] = {}
    for line in measured:
        key = (line["workload"], line["impl"])
        best[key] = max(best.get(key, 0.0), line["tokens_per_s"])
    workloads = sorted({w for w, _ in best}, key=lambda w: (w != "mix", int(w[3:]) if w.startswith("ctx") else 0))
    fig, ax = plt.subplots(figsize=(8, 2.8))
    series = []
    for impl, colour, label in (("memrl", BLUE, "memrl (packed rows)"),
                                ("reference", GREY, "padded reference (TRL-style)")):  # fmt: skip
        values = [best.get((w, impl), 0.0) for w in workloads]
        series.append((values, [f"{v:,.0f}" if v else "not run" for v in values], colour, label))
    paired_barh(ax, series)
    ax.set_yticks(range(len(workloads)), workloads)
    ax.invert_yaxis()
    ax.set_xlabel(f"tokens/s, Qwen3-4B shape, LoRA, bf16 ({data['device'].split(' (')[0]})")
    ax.set_xlim(0, 1.15 * max(best.values()))
    ax.legend(fontsize=8, frameon=False, ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    return finish(fig, ax)


@plot("packed_attention_cpu")
def packed_attention_cpu() -> Any:
    """CPU seconds of one attention layer (forward and backward) over a packed micro-batch, per path, against the
    token budget: the packed path follows the rows' squared lengths, the dense mask the budget's square."""
    data = load("packed_attention_cpu.json")
    cases = data["cases"]
    budgets = [c["budget"] for c in cases]
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    for key, label, colour in (("packed", "packed rows, no mask", BLUE), ("dense_mask", "dense [L, L] mask", RED),
                               ("padded", "padded rows", GREY)):  # fmt: skip
        ax.plot(budgets, [c[key]["attention_cpu_seconds"] for c in cases], "o-", color=colour, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(budgets, [f"{b // 1024}K" for b in budgets])
    ax.set_xlabel("tokens in the packed micro-batch (rows of mixed lengths)")
    ax.set_ylabel("CPU s, one attention layer")
    ax.legend(fontsize=8, frameon=False)
    return finish(fig, ax)


@plot("reentry")
def reentry() -> Any:
    """Seconds to re-enter a state against the steps already taken, by replay and by snapshot/restore."""
    data = load("reentry.json")
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    for key, label, colour in (("replay", "replay the logged actions", ORANGE),
                               ("snapshot", "snapshot / restore", BLUE)):  # fmt: skip
        ax.plot(data["horizons"], [1000 * s for s in data[key]["seconds_per_branch"]], "o-", color=colour, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("steps already taken (horizon)")
    ax.set_ylabel("ms per branch")
    ax.legend(fontsize=8, frameon=False)
    return finish(fig, ax)


# ----------------------------------------------------------------------------------------------------------------------
def svg(fig: Any) -> bytes:
    """The figure as deterministic SVG bytes (no date, fixed element ids)."""
    buffer = io.BytesIO()
    with plt.rc_context({"svg.hashsalt": "memrl", "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return buffer.getvalue()


def render_all() -> dict[str, bytes]:
    """Every registered plot: ``{"<name>.svg": svg bytes}``."""
    plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 9})
    return {f"{name}.svg": svg(make()) for name, make in PLOTS.items()}


def main() -> None:
    """Write every plot to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder to write <name>.svg into")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, content in render_all().items():
        (args.out / name).write_bytes(content)
        print(args.out / name)


if __name__ == "__main__":
    main()
