"""``python -m flat.train --task mqar --sweep``: MQAR accuracy against state size, a line per mixer and
a panel per key-value count, as Zoology's figure (Arora et al., 2023) draws it.

Every chosen linear-attention mixer is trained at every state size of the grid (``--sweep-states``,
floats per layer) and every key-value count (``--sweep-pairs``), each point a fresh model trained
for ``--steps`` steps and scored on held-out sequences; softmax attention (always in the sweep, as
the reference) once per key-value count, its state being its KV cache (2 x seq_len x width floats
per layer), drawn as a point at that size. One progress bar over the grid; ``--json`` gets every
point, ``--plot`` the figure. ``--quick``: a coarse grid and short runs, a few minutes in all.
"""

import copy
import json
import sys
import time
from pathlib import Path
from typing import Dict, List

from . import loop
from .model import SOFTMAX

# The full sweep's sizes: the single run's budget (1500 steps of 64 x 128 tokens, which every mixer
# needs to learn 32 pairs at 4096 floats) at three state sizes small enough to bind (at 1024 floats
# plain linear attention still holds 32 pairs: 98%), 13 points, about half an hour on both cores of a
# 2-core CPU. A shorter budget measures how fast a mixer learns, not what its state holds
# (docs/training.md, "MQAR across state sizes"); each further key-value count (--sweep-pairs, with
# a --seq-len of at least 3 per pair) costs as much again.
GRID = dict(states=(256, 512, 1024), pairs=(32,), seq_len=128, vocab_size=128, batch_size=64, steps=1500)
QUICK = dict(states=(512, 2048), pairs=(16,), seq_len=128, vocab_size=128, batch_size=32, steps=150)
SWEEP_VARIANTS = ("la", "gla", "deltanet", "gated_deltanet")


def defaults(args) -> None:
    """The grid's and the runs' sizes where the command line leaves them (--quick: the coarse ones),
    before the single run's defaults fill the rest."""
    grid = QUICK if args.quick else GRID
    if args.sweep_states is None:
        args.sweep_states = list(grid["states"])
    if args.sweep_pairs is None:
        args.sweep_pairs = list(grid["pairs"])
    for name in ("seq_len", "vocab_size", "batch_size", "steps"):
        if getattr(args, name) is None:
            setattr(args, name, grid[name])


def points(args) -> List[dict]:
    """The grid, in the order it runs: per key-value count, each mixer at each state size in the order
    --variants gives them (softmax attention, last unless listed, once)."""
    grid = []
    for pairs in args.sweep_pairs:
        for variant in args.variants:
            states = [None] if variant == SOFTMAX else args.sweep_states
            grid += [dict(variant=variant, pairs=pairs, state_size=state) for state in states]
    return grid


def point_args(args, point: dict):
    """The settings of one point's run: the sweep's, with its pairs and state size."""
    run = copy.copy(args)
    run.pairs = point["pairs"]
    run.state_size = point["state_size"] or args.state_size
    return run


def run(args, parallel) -> List[dict]:
    """Trains every point of the grid (each model built, and every size checked, before the first
    step) and returns the points with their results; prints a table per key-value count, writes
    --json and --plot."""
    grid = points(args)
    runs = [point_args(args, point) for point in grid]
    tasks, models = {}, []
    try:
        for point, run_args in zip(grid, runs):
            if point["pairs"] not in tasks:
                tasks[point["pairs"]] = loop.make_task(run_args)
            models.append(loop.build(run_args, tasks[point["pairs"]], point["variant"]))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm
        bar = tqdm(total=len(grid), desc="mqar sweep", unit="point", file=sys.stderr, dynamic_ncols=True)
    scoring = {pairs: loop.evaluation_sets(args, task) for pairs, task in tasks.items()}
    start = time.perf_counter()
    for point, run_args, model in zip(grid, runs, models):
        result = loop.train_one(run_args, tasks[point["pairs"]], model, scoring[point["pairs"]], parallel, quiet=True)
        point.update(accuracy=result["accuracy"], held_out_loss=result["held_out_loss"],
                     steps_to_90=result["steps_to_90"], seconds=result["seconds"],
                     state_floats=result["state_floats"] or kv_cache_floats(args), parameters=result["parameters"])
        if bar is not None:
            bar.set_postfix({"last": f"{point['variant']} {point['pairs']} pairs {point['state_floats']}: "
                                     f"{point['accuracy']:.3f}"}, refresh=False)
            bar.update(1)
        else:
            print(f"{point['variant']} pairs={point['pairs']} state={point['state_floats']}: "
                  f"accuracy {point['accuracy']:.4f}", file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    print_table(args, grid)
    if args.json:
        # The single run's settings but the two the grid replaces, and the grid.
        settings = {k: v for k, v in loop.settings(args, parallel).items() if k not in ("pairs", "state_size")}
        settings.update(variants=args.variants, sweep_states=args.sweep_states, sweep_pairs=args.sweep_pairs)
        Path(args.json).write_text(json.dumps({"settings": settings, "points": grid,
                                               "seconds": time.perf_counter() - start}, indent=1))
    if args.plot:
        plot(args, grid)
    return grid


def kv_cache_floats(args) -> int:
    """Softmax attention's state per layer: the keys and values of every token, 2 x seq_len x width."""
    return 2 * args.seq_len * args.hidden_size


def by_pairs(grid: List[dict]) -> Dict[int, List[dict]]:
    panels: Dict[int, List[dict]] = {}
    for point in grid:
        panels.setdefault(point["pairs"], []).append(point)
    return panels


def print_table(args, grid: List[dict]) -> None:
    """Held-out accuracy per mixer (rows) and state size (columns), one table per key-value count."""
    for pairs, panel in by_pairs(grid).items():
        print(f"MQAR, {pairs} key-value pairs in {args.seq_len} tokens: held-out accuracy per state size "
              f"(floats per layer)")
        print(f"{'mixer':16}" + "".join(f"{s:>9}" for s in args.sweep_states))
        for variant in args.variants:
            row = {p["state_size"]: p for p in panel if p["variant"] == variant}
            if variant == SOFTMAX:
                print(f"{variant:16} {row[None]['accuracy']:8.3f} (its KV cache: {row[None]['state_floats']})")
                continue
            print(f"{variant:16}" + "".join(f"{row[s]['accuracy']:9.3f}" for s in args.sweep_states))


def plot(args, grid: List[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = by_pairs(grid)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False, sharey=True)
    for ax, (pairs, panel) in zip(axes[0], panels.items()):
        for variant in args.variants:
            mine = sorted((p for p in panel if p["variant"] == variant), key=lambda p: p["state_floats"])
            x, y = [p["state_floats"] for p in mine], [p["accuracy"] for p in mine]
            if variant == SOFTMAX:
                ax.plot(x, y, marker="*", markersize=12, linestyle="none", color="black", label="softmax (KV cache)")
                ax.axhline(y[0], color="black", linestyle=":", linewidth=1)
            else:
                ax.plot(x, y, marker="o", label=variant)
        ax.set(xscale="log", xlabel="state size (floats per layer)", title=f"{pairs} key-value pairs, "
               f"{args.seq_len} tokens", ylim=(0, 1.02))
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=2))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1024:g}k"))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out accuracy")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)

