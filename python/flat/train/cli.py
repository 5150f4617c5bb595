"""``python -m flat.train`` (or ``flat-train``): train small models of one or several variants side by
side on MQAR or a character-level language model, with a progress bar, a safetensors checkpoint
per variant, a JSON log and a plot of the curves.

    python -m flat.train --task mqar --variants gated_deltanet,kda,softmax --json mqar.json --plot mqar.png

``--task mqar --sweep`` trains the variants and softmax attention over a grid of state sizes and
key-value counts instead (python/flat/train/sweep.py): accuracy against state size, Zoology's figure.

Every argument is checked, and every model built, before the first step. Results are the same
for a given seed and thread count (``--threads``, default PyTorch's).

Under ``torchrun --nproc-per-node N`` it trains on N processes (gloo), data-parallel (PyTorch's
DDP), context-parallel (``--context-parallel``: ranks that split every sequence along T) or both,
with the results of one process within rounding (docs/training.md, "Multi-process training").
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

from .. import PRECISIONS
from .._process import exit_after_process_group
from . import sweep
from .loop import Parallel, build, evaluation_sets, make_task, save_checkpoint, settings, train_one
from .model import MIXERS, SOFTMAX

# Defaults sized for a 2-core CPU: a variant trains in a minute or two.
DEFAULTS = {
    # MQAR's state of 512 floats per layer binds: at 4096 every mixer learns 32 pairs (97-100%), at
    # 512 they part (docs/training.md, "MQAR").
    "mqar": dict(steps=1500, seq_len=128, pairs=32, vocab_size=128, batch_size=64, lr=3e-3, state_size=512),
    "charlm": dict(steps=600, seq_len=128, pairs=None, vocab_size=None, batch_size=32, lr=3e-3, state_size=4096),
}


def _sizes(text: str) -> List[int]:
    """A comma-separated list of positive integers (--sweep-states, --sweep-pairs)."""
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got '{text}'")
    return sizes


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flat.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=sorted(DEFAULTS), required=True)
    p.add_argument("--variants",
                   help=f"comma-separated mixers: {', '.join(MIXERS)} (softmax: the attention baseline); "
                        f"with --sweep, default {','.join(sweep.SWEEP_VARIANTS)}")
    p.add_argument("--steps", type=int, help="optimiser steps per variant (mqar 1500, charlm 600)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (mqar 128, charlm 128)")
    p.add_argument("--pairs", type=int, help="MQAR key-value pairs per sequence (32)")
    p.add_argument("--vocab-size", type=int, help="MQAR vocabulary, blank + keys + values (128)")
    p.add_argument("--text", help="charlm: train on this text file (.gz and .dz read too) instead of the "
                                  "generated toy English; its last 10%% is held out")
    p.add_argument("--batch-size", type=int, help="sequences per step (mqar 64, charlm 32)")
    p.add_argument("--lr", type=float, help="peak learning rate of AdamW (3e-3)")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2, help="heads of each mixer (value heads for sla)")
    p.add_argument("--state-size", type=int,
                   help="recurrent state per layer in floats (N K V), the same for every variant (mqar 512, "
                        "charlm 4096)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="activations (bfloat16: autocast, float32 master weights)")
    p.add_argument("--precision", choices=PRECISIONS, default=PRECISIONS[0],
                   help="the linear-attention kernels' chunk products (flat.torch's precision=; docs/algorithm.md)")
    p.add_argument("--context-parallel", type=int, default=1, metavar="N",
                   help="under torchrun: ranks per context-parallel group, which split every sequence along T; "
                        "the world's processes / N groups are data-parallel (1: data parallelism alone)")
    p.add_argument("--sweep", action="store_true",
                   help="mqar: accuracy against state size, every variant (and softmax attention) at every state "
                        "size and key-value count of the grid; --json gets every point, --plot the figure")
    p.add_argument("--sweep-states", type=_sizes, metavar="S,S,...",
                   help=f"--sweep's state sizes, floats per layer ({','.join(map(str, sweep.GRID['states']))})")
    p.add_argument("--sweep-pairs", type=_sizes, metavar="P,P,...",
                   help=f"--sweep's key-value counts ({','.join(map(str, sweep.GRID['pairs']))})")
    p.add_argument("--quick", action="store_true", help="--sweep on a coarse grid with short runs (a few minutes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="PyTorch's threads (default: its own choice)")
    p.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations")
    p.add_argument("--stop-at", type=float, metavar="ACCURACY",
                   help="mqar: stop after the first held-out evaluation at this accuracy or above (the learning "
                        "rate keeps the schedule of --steps)")
    p.add_argument("--checkpoint-dir", default="flat-train-checkpoints",
                   help="where each variant's final weights go, as <task>-<variant>.safetensors ('' for none)")
    p.add_argument("--json", help="write the log (settings, curves, final metrics, times) here")
    p.add_argument("--plot", help="write a PNG of the loss and metric curves per variant here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (a line per evaluation instead)")
    args = p.parse_args(argv)
    if args.sweep:
        if args.task != "mqar":
            p.error(f"--sweep: only for --task mqar, got --task {args.task}")
        for name in ("pairs", "state_size"):
            if getattr(args, name) is not None:
                p.error(f"--{name.replace('_', '-')}: not with --sweep, which takes --sweep-pairs and --sweep-states")
        args.variants = args.variants or ",".join(sweep.SWEEP_VARIANTS)
        sweep.defaults(args)
    elif args.quick or args.sweep_states or args.sweep_pairs:
        p.error("--quick, --sweep-states, --sweep-pairs: only with --sweep")
    if args.variants is None:
        p.error("--variants: expected comma-separated mixers (required without --sweep)")
    for name in ("pairs", "vocab_size"):
        if args.task == "charlm" and getattr(args, name) is not None:
            p.error(f"--{name.replace('_', '-')}: only for --task mqar (charlm's vocabulary is the text's bytes)")
    if args.stop_at is not None and args.task == "charlm":
        p.error("--stop-at: only for --task mqar (an accuracy; charlm's metric is bits per character)")
    if args.stop_at is not None and args.sweep:
        p.error("--stop-at: not with --sweep (its points compare the accuracies at the end of --steps)")
    for name, value in DEFAULTS[args.task].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in MIXERS]
    if unknown or not args.variants:
        p.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; expected some of {', '.join(MIXERS)}")
    if len(set(args.variants)) != len(args.variants):
        p.error("--variants: a variant is listed twice")
    if args.sweep and SOFTMAX not in args.variants:  # the reference every panel shows
        args.variants.append(SOFTMAX)
    for name in ("steps", "seq_len", "batch_size", "hidden_size", "layers", "heads", "state_size", "eval_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected at least 1, got {getattr(args, name)}")
    if args.stop_at is not None and not 0 < args.stop_at <= 1:
        p.error(f"--stop-at: expected an accuracy in (0, 1], got {args.stop_at}")
    if not args.lr > 0 or not math.isfinite(args.lr):
        p.error(f"--lr: expected a positive number, got {args.lr}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads: expected at least 1, got {args.threads}")
    if args.text is not None and args.task != "charlm":
        p.error(f"--text: only for --task charlm, got --task {args.task}")
    if args.plot and not args.plot.endswith(".png"):
        p.error(f"--plot: expected a .png file name, got {args.plot}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.sweep and world > 1:
        p.error(f"--sweep: runs in one process, got {world} (torchrun)")
    if args.context_parallel < 1 or world % args.context_parallel:
        p.error(f"--context-parallel: expected a divisor of the {world} processes (torchrun --nproc-per-node), "
                f"got {args.context_parallel}")
    if args.context_parallel > 1 and SOFTMAX in args.variants:
        p.error("--context-parallel: softmax attention cannot split its sequences (each token attends to every "
                "earlier one, at rotary positions counted from the sequence's start); train it with "
                "--context-parallel 1")
    if args.seq_len < args.context_parallel:
        p.error(f"--seq-len {args.seq_len}: fewer tokens than the --context-parallel {args.context_parallel} ranks "
                "that share each sequence")
    if args.batch_size < world // args.context_parallel:
        p.error(f"--batch-size {args.batch_size}: fewer sequences than the {world // args.context_parallel} "
                "data-parallel ranks that share each batch")
    return args


def plot(args, results: Dict[str, dict], floor: Optional[float]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    metric = "accuracy" if args.task == "mqar" else "bpc"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for variant, r in results.items():
        c = r["curves"]
        left.plot(c["step"], c["held_out_loss"], label=variant)
        line, = right.plot(c["step"], c[metric], label=variant)
        if "training_bpc" in c:
            right.plot(c["step"], c["training_bpc"], color=line.get_color(), linestyle=":", linewidth=1)
    if floor is not None:
        right.axhline(floor, color="black", linestyle="--", linewidth=1, label="the text's information")
    left.set(xlabel="step", ylabel="held-out loss", yscale="log", title=f"{args.task}: loss")
    right.set(xlabel="step", ylabel=f"held-out {metric}", title=f"{args.task}: {metric}")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> Dict[str, dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    parallel = Parallel(args.context_parallel)
    if args.sweep:
        return sweep.run(args, parallel)
    try:
        task = make_task(args)
        args.vocab_size = task.vocab_size
        # Every size checked before any step.
        models = {v: build(args, task, v, parallel.ops) for v in args.variants}
    except ValueError as e:  # on every rank alike
        print(f"error: {e}", file=sys.stderr)
        parallel.close()
        raise SystemExit(2)
    scoring = evaluation_sets(args, task)
    results = {}
    for variant, model in models.items():
        results[variant] = train_one(args, task, model, scoring, parallel)
        results[variant]["checkpoint"] = save_checkpoint(args, variant, model) if parallel.is_main else None
    parallel.close()
    if not parallel.is_main:
        return results
    metric = "accuracy" if args.task == "mqar" else "bpc"
    reach = metric == "accuracy"
    floor = getattr(task, "floor_bpc", None)
    if floor is not None:
        print(f"the generated text's own information: {floor:.4f} bits per held-out character (no model's "
              f"expected bpc is below it)")
    second_column = "90% at step" if reach else "training bpc"
    print(f"{'variant':16} {'held-out ' + metric:>18} {second_column:>12} {'state':>7} {'params':>8} {'tok/s':>9} "
          f"{'time':>7}")
    for variant, r in results.items():
        state = "-" if r["state_floats"] is None else str(r["state_floats"])
        if reach:
            second = f" {'-' if r['steps_to_90'] is None else r['steps_to_90']:>12}"
        else:
            second = f" {r['training_bpc']:12.4f}"
        print(f"{variant:16} {r[metric]:18.4f}{second} {state:>7} {r['parameters']:8d} "
              f"{r['tokens_per_second']:9.0f} {r['seconds']:6.1f}s")
    if args.json:
        log = {"settings": settings(args, parallel), "results": results}
        if floor is not None:
            log["floor_bpc"] = floor
        Path(args.json).write_text(json.dumps(log, indent=1))
    if args.plot:
        plot(args, results, floor)
    return results


def console() -> None:
    """The command (python -m flat.train, the console script flat-train): main() without its return
    value, which a console script would take for an exit status. A rank of a torchrun world ends
    without the interpreter's finalization once main() is done (flat._process: gloo's threads
    otherwise abort the process now and then as it exits), with main()'s exit status."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        main()
        return
    try:
        main()
    except SystemExit as e:  # a refused argument: the status main() gives, as Python would end
        if e.code is None or isinstance(e.code, int):
            exit_after_process_group(e.code or 0)
        print(e.code, file=sys.stderr)
        exit_after_process_group(1)
    exit_after_process_group()


if __name__ == "__main__":
    console()
