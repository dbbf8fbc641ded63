"""The printed table, the closing line, a JSON record and the per-position plot."""

from __future__ import annotations

import json
import os

from .speculate import NUM_STEPS, SpecStats


def table(rows: list[tuple[str, SpecStats, SpecStats]]) -> str:
    """Markdown table: one row per draft load, both the decoding and the held-out figures."""
    positions = " | ".join(f"pos {k}" for k in range(1, NUM_STEPS + 1))
    lines = [
        f"| draft | accept length | accept rate | {positions} | verify steps "
        "| held-out accept length |",
        "|---" * (NUM_STEPS + 5) + "|",
    ]
    for label, decode, heldout in rows:
        per_pos = " | ".join(
            f"{decode.reached(k):.3f} ({decode.conditional(k):.2f})"
            for k in range(1, NUM_STEPS + 1)
        )
        lines.append(
            f"| {label} | {decode.accept_length:.3f} | {decode.accept_rate:.3f} | {per_pos} "
            f"| {decode.verify_steps} | {heldout.accept_length:.3f} |"
        )
    return "\n".join(lines)


def stats_record(stats: SpecStats) -> dict:
    return {
        "accept_length": round(stats.accept_length, 4),
        "accept_rate": round(stats.accept_rate, 4),
        "verify_steps": stats.verify_steps,
        "accepted_drafts": stats.accepted,
        "histogram": stats.histogram,
        "reached": [round(stats.reached(k), 4) for k in range(1, NUM_STEPS + 1)],
        "conditional": [round(stats.conditional(k), 4) for k in range(1, NUM_STEPS + 1)],
        "generated_tokens": stats.generated,
    }


def write_json(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2)


def plot(path: str, rows: list[tuple[str, SpecStats, SpecStats]], title: str) -> None:
    """Bar chart: share of verify steps that accepted draft position k, per draft load."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    colours = {"float": "#4c72b0", "plugin": "#55a868", "stock": "#c44e52"}
    positions = list(range(1, NUM_STEPS + 1))
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    for i, (label, decode, _heldout) in enumerate(rows):
        key = label.split()[0]
        xs = [p + (i - (len(rows) - 1) / 2) * width for p in positions]
        values = [decode.reached(p) for p in positions]
        bars = ax.bar(
            xs,
            values,
            width,
            label=f"{label}: accept length {decode.accept_length:.2f}",
            color=colours.get(key),
        )
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=8, padding=2)
    ax.set_xticks(positions, [f"draft token {p}" for p in positions])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share of verify steps accepting it")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
