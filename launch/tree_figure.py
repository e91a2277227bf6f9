"""Draw one memory-call tree of a run as a PNG: what the memory model wrote at each node, its value V(n), committee
score c(n), reward r(n) and advantage A(n), and each leaf's outcome.

OAT-GRPO writes the trees of its last iteration to ``trees_last.jsonl`` in its run folder (``memrl quickstart`` puts
it under ``rl/``). The tree drawn is ``--tree`` or, by default, the one with the most outcome-informative sibling
groups (siblings whose V(n) differ), ties broken by size: the tree that shows credit assignment at work.

    python -m memrl.launch.tree_figure runs/quickstart-*/rl/trees_last.jsonl --out tree.png [--tree TREE_ID]
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from memrl.data.io import read_jsonl
from memrl.data.schemas import MemoryCallTree, TreeNode
from memrl.rewards.advantage import is_zero_variance

__all__ = ["draw_tree", "informative_group_count", "layout", "main", "pick_tree"]

log = logging.getLogger(__name__)

_COLUMN = 4.2  # inches between depths
_ROW = 0.62  # inches between leaves


def informative_group_count(tree: MemoryCallTree) -> int:
    """Sibling groups of ``tree`` (two or more memory nodes with one ``group_id``) whose values V(n) differ."""
    groups: dict[str, list[float]] = {}
    for node in tree.nodes:
        if node.kind == "memory" and node.group_id is not None:
            groups.setdefault(node.group_id, []).append(node.value or 0.0)
    return sum(len(v) > 1 and not is_zero_variance(v) for v in groups.values())


def pick_tree(trees: Sequence[MemoryCallTree], tree_id: str | None = None) -> MemoryCallTree:
    """The tree named ``tree_id``, or the one with the most informative sibling groups (then the most nodes)."""
    if not trees:
        raise ValueError("no trees to draw")
    if tree_id is not None:
        for tree in trees:
            if tree.tree_id == tree_id or tree.task_id == tree_id:
                return tree
        raise ValueError(f"no tree {tree_id!r}; the file holds: {', '.join(t.tree_id for t in trees)}")
    return max(trees, key=lambda t: (informative_group_count(t), len(t.nodes)))


def layout(tree: MemoryCallTree) -> dict[str, tuple[float, float]]:
    """(x, y) of every node: depth along x, leaves one row apart along y (top to bottom in path order), every other
    node centred on its children."""
    by_id = {n.node_id: n for n in tree.nodes}
    pos: dict[str, tuple[float, float]] = {}
    row = 0

    def place(node_id: str) -> float:
        nonlocal row
        node = by_id[node_id]
        kids = [c for c in node.children if c in by_id]
        if not kids:
            y = -row * _ROW
            row += 1
        else:
            ys = [place(c) for c in kids]
            y = (ys[0] + ys[-1]) / 2
        pos[node_id] = (node.depth * _COLUMN, y)
        return y

    place(tree.root_id)
    return pos


def _intent(node: TreeNode) -> str | None:
    """The intent a recall was made under (the ``intent:`` line of its prompt), if any."""
    if node.call is None:
        return None
    for message in reversed(node.call.messages):
        for line in message.content.splitlines():
            if line.startswith("intent:"):
                return line.split(":", 1)[1].strip()
    return None


def _label(node: TreeNode, width: int) -> str:
    """The text of a node's box: the action (its role, the intent, how many model calls), what the memory model
    returned to the reasoner (a recall's last extraction), then its numbers."""
    if node.kind == "root":
        return "task"
    if node.kind == "leaf":
        return f"outcome {node.outcome if node.outcome is not None else 0:.0f}"
    calls = [c for c in (node.call, *node.follow_up_calls) if c is not None]
    text = " ".join((calls[-1].text if calls else "").split()) or "(empty)"
    wrapped = textwrap.wrap(text, width=width)
    lines = wrapped[:2]
    if len(wrapped) > 2:
        lines[-1] = lines[-1][: width - 3] + "..."
    role = calls[0].role if calls else "memory"
    head = role + (f", {len(calls)} calls" if len(calls) > 1 else "")
    copies = node.metadata.get("copies", 1)
    if copies > 1:
        head += f" (x{copies})"
    intent = _intent(node)
    if intent:
        head += f": {textwrap.shorten(intent, width=max(width - len(head) - 2, 12), placeholder='...')}"
    numbers = [f"V={node.value:.2f}" if node.value is not None else "V=-"]
    if node.committee_score is not None:
        numbers.append(f"c={node.committee_score:.2f}")
    if node.advantage is not None:
        numbers.append(f"A={node.advantage:+.2f}")
    return "\n".join([head, *(f"> {line}" for line in lines), "  ".join(numbers)])


def draw_tree(tree: MemoryCallTree, out: Path, *, width: int = 44, title: str | None = None) -> Path:
    """Render ``tree`` to the PNG ``out`` (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = layout(tree)
    by_id = {n.node_id: n for n in tree.nodes}
    depth = max(n.depth for n in tree.nodes)
    leaves = sum(1 for n in tree.nodes if not [c for c in n.children if c in by_id])
    fig_w = 2.0 + depth * _COLUMN
    fig_h = 1.4 + leaves * _ROW
    fig, ax = plt.subplots(figsize=(fig_w, fig_h), dpi=110)
    ax.set_axis_off()
    for node in tree.nodes:
        for child in node.children:
            if child in pos:
                (x0, y0), (x1, y1) = pos[node.node_id], pos[child]
                ax.plot([x0, x0 + _COLUMN * 0.45, x1], [y0, y1, y1], color="#9aa0b4", lw=0.9, zorder=1)
    groups: dict[str, list[TreeNode]] = {}
    for node in tree.nodes:
        if node.kind == "memory" and node.group_id is not None:
            groups.setdefault(node.group_id, []).append(node)
    palette = ["#eef1fb", "#fdf3e7", "#eef8f0", "#f7eef8", "#fbf9e8", "#eaf6f8"]
    colour = {gid: palette[i % len(palette)] for i, gid in enumerate(sorted(groups))}
    for node in tree.nodes:
        x, y = pos[node.node_id]
        if node.kind == "leaf":
            ok = (node.outcome or 0) > 0.5
            face, edge = ("#d8f0dc", "#2e7d32") if ok else ("#f8dcdc", "#c62828")
            size = 8
        elif node.kind == "root":
            face, edge, size = "#e3e6f0", "#3949ab", 9
        else:
            informative = not is_zero_variance([m.value or 0.0 for m in groups.get(node.group_id or "", [node])])
            face = colour.get(node.group_id or "", "#ffffff")
            edge = "#3949ab" if informative else "#9aa0b4"
            size = 7.5
        ax.text(
            x,
            y,
            _label(node, width),
            ha="left" if node.kind == "memory" else "center",
            va="center",
            fontsize=size,
            family="DejaVu Sans Mono" if node.kind == "memory" else "DejaVu Sans",
            bbox={"boxstyle": "round,pad=0.35", "fc": face, "ec": edge, "lw": 1.0},
            zorder=2,
        )
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 1.0)
    ax.set_ylim(min(ys) - _ROW, max(ys) + _ROW)
    ax.set_title(
        title
        or f"memory-call tree {tree.tree_id}: {informative_group_count(tree)} informative sibling "
        f"groups, {sum(n.kind == 'leaf' for n in tree.nodes)} leaves",
        fontsize=10,
        loc="left",
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m memrl.launch.tree_figure", description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", type=Path, help="a trees_last.jsonl (MemoryCallTree records)")
    parser.add_argument("--out", type=Path, default=Path("tree.png"), help="PNG to write (default tree.png)")
    parser.add_argument("--tree", default=None, help="tree id or task id to draw (default: the most informative)")
    parser.add_argument("--width", type=int, default=44, help="characters of memory-model text per line")
    args = parser.parse_args(argv)
    trees = read_jsonl(args.trees, MemoryCallTree)
    try:
        tree = pick_tree(trees, args.tree)
    except ValueError as exc:
        print(f"tree_figure: error: {args.trees}: {exc}", file=sys.stderr)
        return 2
    out = draw_tree(tree, args.out, width=args.width)
    print(f"{out}: tree {tree.tree_id} ({len(tree.nodes)} nodes, {informative_group_count(tree)} informative groups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
