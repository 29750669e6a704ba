"""The report's three plots, drawn from the figures alone."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or in CI
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from .samples import AUTO, LOAD_PATHS, OFF, OFF_UNBATCHED, PEER_BATCH, PEER_STATIC  # noqa: E402

SPEEDUP_PLOT, ALPHA_PLOT, LOAD_PLOT = "speedup_by_task.png", "alpha_heatmap.png", "load.png"


def write_plots(figures: dict, meta: dict, out: Path) -> list[Path]:
    paths = [_speedup(figures, meta, out / SPEEDUP_PLOT)]
    if figures["alpha_matrix"]:
        paths.append(_alpha(figures["alpha_matrix"], out / ALPHA_PLOT))
    if figures["load"]["levels"]:
        paths.append(_load(figures["load"], out / LOAD_PLOT))
    return paths


def _median(spread: dict | None) -> float:
    return spread["median"] if spread else 0.0


def _error(spread: dict | None) -> tuple[float, float]:
    return (spread["median"] - spread["p25"], spread["p75"] - spread["median"]) if spread else (0.0, 0.0)


def _speedup(figures: dict, meta: dict, path: Path) -> Path:
    tasks = list(figures["tasks"])
    rows = [figures["tasks"][t] for t in tasks]
    x = range(len(tasks))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.38
    for offset, label, spreads in ((-width / 2, f"task draft, k={meta['k']}", [r["speedup"] for r in rows]),
                                   (width / 2, "routed (policy)", [r["routed"]["speedup"] for r in rows])):
        ax.bar([i + offset for i in x], [_median(s) for s in spreads], width, label=label,
               yerr=list(zip(*[_error(s) for s in spreads])), capsize=3)
    ax.scatter([i - width / 2 for i in x], [r["bound"] or 0 for r in rows], marker="_", s=600, color="black",
               label="Leviathan bound (measured alpha, c, k)", zorder=3)
    goals = meta["goals"]["speedup"]
    ax.scatter(list(x), [goals.get(t, 0) for t in tasks], marker="*", s=120, color="crimson", label="goal", zorder=3)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(list(x), tasks)
    ax.set_ylabel("greedy speedup over target-only (median, IQR)")
    ax.set_title(f"Speedup by task ({meta['zoo']['preset']} zoo)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _alpha(matrix: dict[str, dict[str, float]], path: Path) -> Path:
    tasks = list(matrix)
    drafts = sorted({d for row in matrix.values() for d in row})
    values = [[matrix[t].get(d, float("nan")) for d in drafts] for t in tasks]
    fig, ax = plt.subplots(figsize=(1.4 * len(drafts) + 2, 0.7 * len(tasks) + 1.5))
    image = ax.imshow(values, vmin=0, vmax=1, cmap="viridis")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=9)
    ax.set_xticks(range(len(drafts)), drafts)
    ax.set_yticks(range(len(tasks)), tasks)
    ax.set_xlabel("draft")
    ax.set_ylabel("task")
    ax.set_title("alpha: draft's greedy choice equals the target's token")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


LABELS = {OFF: "specserve OFF", AUTO: "specserve AUTO", OFF_UNBATCHED: "specserve OFF, batching off",
          PEER_STATIC: "transformers generate, static batch", PEER_BATCH: "transformers generate_batch"}


def _load(load: dict, path: Path) -> Path:
    levels = sorted(load["levels"], key=int)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name in LOAD_PATHS:
        present = [lvl for lvl in levels if name in load["levels"][lvl]]
        if not present:
            continue
        xs, rows = [int(lvl) for lvl in present], [load["levels"][lvl][name] for lvl in present]
        style = {"marker": "o", "linestyle": "--" if name in (PEER_STATIC, PEER_BATCH) else "-", "label": LABELS[name]}
        left.plot(xs, [r["tokens_per_second"] or 0 for r in rows], **style)
        right.plot(xs, [r["p99"] for r in rows], **style)
    for ax, label in ((left, "aggregate tokens/s"), (right, "p99 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (a peer's batch size)")
        ax.set_ylabel(label)
        ax.set_xticks([int(lvl) for lvl in levels], levels)
        ax.minorticks_off()
    left.legend(fontsize=8)
    fig.suptitle("Load: mixed tasks, greedy, the same target model")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
