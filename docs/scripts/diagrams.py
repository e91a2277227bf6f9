"""Write the site's two diagrams as SVG: ``docs/figures/pipeline.svg`` (the pipeline, for the README and the home
page) and ``docs/figures/iteration.svg`` (one OAT-GRPO iteration through the modules, for the architecture page).

Plain SVG text, no dependency: boxes, labels and arrows laid out on a grid. ``tests/test_docs.py`` checks the
committed files are what this script writes.

    python docs/scripts/diagrams.py [--check]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from html import escape
from pathlib import Path

from generated import write_or_check

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"

FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
MONO = "font-family='DejaVu Sans Mono, Menlo, Consolas, monospace'"
ARROW_DEF = (
    "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7' "
    "orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' fill='#5c6273'/></marker></defs>"
)


def box(
    x: float,
    y: float,
    w: float,
    h: float,
    title: str,
    lines: list[str],
    *,
    fill: str = "#eef1fb",
    stroke: str = "#3949ab",
    mono: bool = False,
) -> str:
    """A rounded box with a bold title and smaller lines under it."""
    out = [
        f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='8' fill='{fill}' stroke='{stroke}' stroke-width='1.4'/>"
    ]
    ty = y + 22
    out.append(
        f"<text x='{x + w / 2}' y='{ty}' text-anchor='middle' font-size='14' font-weight='bold' {FONT} "
        f"fill='#1a1f36'>{escape(title)}</text>"
    )
    for i, line in enumerate(lines):
        out.append(
            f"<text x='{x + w / 2}' y='{ty + 19 + 16 * i}' text-anchor='middle' font-size='11.5' "
            f"{MONO if mono else FONT} fill='#3a4055'>{escape(line)}</text>"
        )
    return "\n".join(out)


def arrow(x1: float, y1: float, x2: float, y2: float, label: str = "", *, dashed: bool = False) -> str:
    """A straight arrow, optionally labelled at its middle."""
    dash = " stroke-dasharray='5,4'" if dashed else ""
    out = [
        f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='#5c6273' stroke-width='1.6'{dash} "
        f"marker-end='url(#arrow)'/>"
    ]
    if label:
        out.append(
            f"<text x='{(x1 + x2) / 2}' y='{(y1 + y2) / 2 - 6}' text-anchor='middle' font-size='11' {FONT} "
            f"fill='#5c6273'>{escape(label)}</text>"
        )
    return "\n".join(out)


def path_arrow(points: list[tuple[float, float]], label: str = "", label_at: tuple[float, float] | None = None) -> str:
    """A polyline arrow through ``points``."""
    d = " ".join(f"{'M' if i == 0 else 'L'}{x},{y}" for i, (x, y) in enumerate(points))
    out = [f"<path d='{d}' fill='none' stroke='#5c6273' stroke-width='1.6' marker-end='url(#arrow)'/>"]
    if label and label_at:
        out.append(
            f"<text x='{label_at[0]}' y='{label_at[1]}' text-anchor='middle' font-size='11' {FONT} "
            f"fill='#5c6273'>{escape(label)}</text>"
        )
    return "\n".join(out)


# (fill, stroke) of the boxes by kind
BLUE_BOX = ("#eef1fb", "#3949ab")
ORANGE_BOX = ("#fff4e5", "#e07b00")
GREEN_BOX = ("#eef8f0", "#2e7d32")
GREY_BOX = ("#f1f1f4", "#5c6273")


def box_row(
    xs: list[float],
    y: float,
    w: float,
    h: float,
    items: list[tuple[str, list[str]]],
    colours: Callable[[int, str], tuple[str, str]],
    *,
    mono: bool = False,
    leftward: bool = False,
) -> list[str]:
    """One row of boxes, ``items`` (title, lines) at ``xs``, box i coloured ``colours(i, title)`` (fill, stroke), each
    joined to the one before by an arrow (``leftward``: the row runs right to left)."""
    out = []
    for i, (x, (title, lines)) in enumerate(zip(xs, items, strict=True)):
        fill, stroke = colours(i, title)
        out.append(box(x, y, w, h, title, lines, fill=fill, stroke=stroke, mono=mono))
        if i and leftward:
            out.append(arrow(xs[i - 1], y + h / 2, x + w + 2, y + h / 2))
        elif i:
            out.append(arrow(xs[i - 1] + w, y + h / 2, x - 2, y + h / 2))
    return out


def svg(width: int, height: int, body: list[str], title: str) -> str:
    """The document around ``body``."""
    return "\n".join(
        [
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
            f"role='img' aria-label='{escape(title)}'>",
            f"<title>{escape(title)}</title>",
            ARROW_DEF,
            f"<rect width='{width}' height='{height}' fill='white'/>",
            *body,
            "</svg>",
            "",
        ]
    )


def pipeline() -> str:
    """Expert traces -> SFT -> RL (with its loop drawn under it) -> export -> evaluation."""
    w, h, gap, y = 178, 92, 34, 40
    stages = [
        ("expert traces", ["an oracle or a frontier", "model inside the", "memory system"]),
        ("distill", ["rejection sampling:", "correct runs only;", "one SFT set per role"]),
        ("SFT", ["TRL SFTTrainer,", "LoRA or full,", "ZeRO-2/3"]),
        ("RL", ["OAT-GRPO (SAM)", "pivot-turn GRPO", "(proactive agent)"]),
        ("export", ["merged HF checkpoint", "+ model card,", "verified in vLLM"]),
        ("evaluate", ["harness: systems x", "models x benchmarks", "(LoCoMo, AMA-Bench)"]),
    ]
    body = [
        f"<text x='20' y='24' font-size='15' font-weight='bold' {FONT} fill='#1a1f36'>memrl: a memory model "
        "from expert traces to a trained, exported checkpoint</text>"
    ]
    xs = [20 + i * (w + gap) for i in range(len(stages))]
    body += box_row(xs, y, w, h, stages, lambda _, title: ORANGE_BOX if title == "RL" else BLUE_BOX)
    # the RL loop under the RL box
    rl = xs[3]
    ly, lw, lh = 200, 150, 74
    loop = [
        ("rollouts", ["trees: K samples", "per memory action"]),
        ("committee", ["references + judge", "-> c(n)"]),
        ("credit", ["r = V(n) + λ(c - c̄)", "-> advantages A"]),
        ("update", ["clipped surrogate", "on response tokens"]),
        ("sync", ["new weights into", "the rollout engines"]),
    ]
    total = len(loop) * lw + (len(loop) - 1) * 24
    start = rl + w / 2 - total / 2
    lxs = [start + i * (lw + 24) for i in range(len(loop))]
    body.append(
        f"<rect x='{start - 16}' y='{ly - 34}' width='{total + 32}' height='{lh + 70}' rx='10' "
        "fill='#fffaf2' stroke='#e07b00' stroke-width='1' stroke-dasharray='6,4'/>"
    )
    body.append(
        f"<text x='{start - 4}' y='{ly - 14}' font-size='12' {FONT} fill='#9a5400'>one RL iteration "
        "(the frozen reasoner continues every sample; only the memory model is trained)</text>"
    )
    body += box_row(lxs, ly, lw, lh, loop, lambda *_: ("#ffffff", "#e07b00"))
    body.append(
        path_arrow(
            [
                (lxs[-1] + lw / 2, ly + lh),
                (lxs[-1] + lw / 2, ly + lh + 18),
                (lxs[0] + lw / 2, ly + lh + 18),
                (lxs[0] + lw / 2, ly + lh + 2),
            ],
            "next iteration",
            ((lxs[0] + lxs[-1] + lw) / 2, ly + lh + 14),
        )
    )
    body.append(arrow(rl + w / 2, y + h, rl + w / 2, ly - 36, dashed=True))
    width = int(max(xs[-1] + w, lxs[-1] + lw + 16) + 20)
    return svg(width, ly + lh + 50, body, "memrl pipeline")


def iteration() -> str:
    """One OAT-GRPO iteration through the modules: a snake of boxes, the top row left to right, the bottom right to
    left, and the sync back to the loop."""
    w, h, gap = 196, 78, 22
    top = [
        ("recipe", ["train/oat_grpo.py", "train_oat_grpo"]),
        ("loop", ["train/online.py", "OnlineLoop.collected"]),
        ("fleet", ["rollout/fleet.py", "shard_tasks, submit"]),
        ("worker", ["rollout/worker.py", "RolloutWorker.build"]),
        ("tree", ["rollout/tree.py", "build_trees"]),
        ("committee", ["rewards/committee.py", "Committee.score"]),
    ]
    bottom = [
        ("credit", ["rewards/credit.py", "assign_batch_credit"]),
        ("advantage", ["rewards/advantage.py", "shaped_batch_advantages"]),
        ("groups", ["rewards/groups.py", "trees_to_groups"]),
        ("trainer", ["train/group_trainer.py", "GroupTrainer.step"]),
        ("surrogate", ["train/surrogate.py", "surrogate_loss"]),
        ("sync", ["train/online.py", "OnlineLoop.sync"]),
    ]
    y1, y2 = 50, 200
    xs = [24 + i * (w + gap) for i in range(len(top))]
    body = [
        f"<text x='20' y='28' font-size='15' font-weight='bold' {FONT} fill='#1a1f36'>One OAT-GRPO iteration, "
        "module by module</text>"
    ]
    body += box_row(xs, y1, w, h, top, lambda i, _: GREY_BOX if i < 2 else BLUE_BOX, mono=True)
    body += box_row(
        xs[::-1], y2, w, h, bottom, lambda i, _: GREEN_BOX if i < 3 else ORANGE_BOX, mono=True, leftward=True
    )
    body.append(arrow(xs[-1] + w / 2, y1 + h, xs[-1] + w / 2, y2 - 2, "trees"))
    mid = (y1 + h + y2) / 2
    body.append(
        path_arrow(
            [(xs[0], y2 + h / 2), (8, y2 + h / 2), (8, mid), (xs[1] + w / 2, mid), (xs[1] + w / 2, y1 + h + 2)],
            "policy version v+1: next iteration",
            (xs[0] + w / 2 + 30, mid - 6),
        )
    )
    legend = [
        ("#f1f1f4", "#5c6273", "driver (every process)"),
        ("#eef1fb", "#3949ab", "rollout plane (rank 0 drives Ray workers)"),
        ("#eef8f0", "#2e7d32", "rewards (main process, whole batch)"),
        ("#fff4e5", "#e07b00", "training (every process)"),
    ]
    for i, (fill, stroke, text) in enumerate(legend):
        lx = 20 + i * 320 + 40
        body.append(f"<rect x='{lx}' y='{y2 + h + 30}' width='16' height='12' fill='{fill}' stroke='{stroke}'/>")
        body.append(
            f"<text x='{lx + 22}' y='{y2 + h + 40}' font-size='11.5' {FONT} fill='#3a4055'>{escape(text)}</text>"
        )
    return svg(int(xs[-1] + w + 20), y2 + h + 60, body, "one OAT-GRPO iteration")


FIGS = {"pipeline.svg": pipeline, "iteration.svg": iteration}


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the diagrams."""
    return write_or_check({FIGURES / name: make() for name, make in FIGS.items()}, __file__, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
