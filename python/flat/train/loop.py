"""One training run's pieces, shared by the single runs (cli.py) and the sweep (sweep.py): this
process's part of a torchrun world, the task and model a run trains, the training loop, the scoring,
the checkpoint and the settings a log records."""

import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ..nn import context_parallel
from .model import LanguageModel, state_floats
from .tasks import IGNORE, MQAR, CharLM

HELD_OUT = {"mqar": 1024, "charlm": 64}  # held-out sequences


class Parallel:
    """This process's part under torchrun (WORLD_SIZE, RANK and the rendezvous in the environment):
    the world is ``data`` groups of ``context`` consecutive ranks; each group takes its slice of
    every batch's sequences, each rank of a group its share of their tokens. One process alone
    without torchrun (or with one process)."""

    def __init__(self, context: int):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.context, self.data = context, self.world // context
        self.data_rank, self.context_rank = divmod(self.rank, context)
        self.ops = "kernels"
        if self.world > 1:
            dist.init_process_group("gloo")
            if context > 1:  # every rank creates every group, in the same order
                groups = [dist.new_group(list(range(first, first + context)))
                          for first in range(0, self.world, context)]
                self.ops = context_parallel(groups[self.data_rank])

    @property
    def is_main(self) -> bool:
        """The rank that prints and writes (logs, checkpoints, plot)."""
        return self.rank == 0

    def share(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's part of a batch [B, T]: its data group's slice of the sequences, its share of
        their tokens (as even as they divide)."""
        return x.tensor_split(self.data, dim=0)[self.data_rank].tensor_split(self.context, dim=1)[self.context_rank]

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model whose backward averages every parameter's gradient over the world (DDP)."""
        return DistributedDataParallel(model) if self.world > 1 else model

    def total(self, *values: float) -> List[float]:
        """The sums of values over the world's ranks (float64)."""
        summed = torch.tensor(values, dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(summed)
        return summed.tolist()

    def close(self) -> None:
        if self.world > 1:
            dist.barrier()  # no rank tears its connections down while another still uses them
            dist.destroy_process_group()


def make_task(args):
    if args.task == "mqar":
        return MQAR(args.seq_len, args.pairs, args.vocab_size)
    return CharLM(args.seq_len, args.text)


def build(args, task, variant: str, ops="kernels") -> LanguageModel:
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    return LanguageModel(variant, task.vocab_size, args.hidden_size, args.layers, args.heads, args.state_size,
                         args.precision, ops)


def learning_rate(args, step: int) -> float:
    """Linear warm-up over the first 10% of the steps, then cosine decay to 10% of the peak."""
    warmup = max(1, args.steps // 10)
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, args.steps - warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def scored(logits: torch.Tensor, targets: torch.Tensor):
    """(summed cross-entropy over the scored positions, correct predictions, scored positions)."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
    mask = targets != IGNORE
    correct = int((logits.argmax(-1) == targets)[mask].sum())
    return loss, correct, int(mask.sum())


def autocast(args):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")


def evaluate(args, model, held_out, parallel: Parallel) -> Dict[str, float]:
    """Held-out loss and accuracy (MQAR) or bits per character (charlm), each rank scoring its share
    of every batch."""
    model.eval()
    total_loss = total_correct = total_scored = 0.0
    with torch.no_grad(), autocast(args):
        for tokens, targets in held_out:
            loss, correct, count = scored(model(parallel.share(tokens)), parallel.share(targets))
            total_loss += float(loss)
            total_correct += correct
            total_scored += count
    model.train()
    total_loss, total_correct, total_scored = parallel.total(total_loss, total_correct, total_scored)
    loss = total_loss / total_scored
    if args.task == "mqar":
        return {"loss": loss, "accuracy": total_correct / total_scored}
    return {"loss": loss, "bpc": loss / math.log(2)}


def evaluation_sets(args, task):
    """The fixed batches a model is scored on: held-out sequences, and for charlm as many windows
    of the training text (scored the same way, so that the two bpc tell fit from generalisation)."""
    rng = np.random.default_rng(args.seed + 1_000_003)  # never the training stream
    count, size = HELD_OUT[args.task], 64 if args.task == "mqar" else 16
    if args.task == "mqar":
        return {"held_out": [task.batch(rng, size) for _ in range(count // size)]}
    return {"held_out": [task.batch(rng, size, held_out=True) for _ in range(count // size)],
            "training": [task.batch(rng, size) for _ in range(count // size)]}


class Progress:
    """tqdm's bar, or a plain line per evaluation without it."""

    def __init__(self, args, variant: str, shown: bool):
        self.bar = None
        self.shown = shown
        if shown and not args.no_progress:
            from tqdm import tqdm
            self.bar = tqdm(total=args.steps, desc=f"{args.task} {variant}", unit="step", file=sys.stderr,
                            dynamic_ncols=True)
        self.variant = variant

    def step(self, postfix: dict):
        if self.bar is not None:
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(1)

    def note(self, step: int, postfix: dict):
        if self.shown and self.bar is None:
            items = " ".join(f"{k}={v}" for k, v in postfix.items())
            print(f"{self.variant} step {step}: {items}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def train_one(args, task, model: LanguageModel, scoring, parallel: Parallel, quiet: bool = False) -> dict:
    """Trains model on args.steps batches; under torchrun each rank on its share of every batch, its
    loss the sum over its share's scored positions divided by the whole batch's, times the world
    size, which DDP's average of the gradients over the world divides back out: the gradient of the
    whole batch's mean loss, as one process takes it. quiet: no progress bar or lines (a sweep shows
    its own)."""
    variant = model.variant
    trained = parallel.wrap(model)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    rng = np.random.default_rng(args.seed)
    metric = "accuracy" if args.task == "mqar" else "bpc"
    curves = {"step": [], "loss": [], "gradient_norm": [], "held_out_loss": [], metric: []}
    if "training" in scoring:
        curves["training_bpc"] = []
    progress = Progress(args, variant, parallel.is_main and not quiet)
    tokens_seen, start = 0, time.perf_counter()
    for step in range(args.steps):
        tokens, targets = task.batch(rng, args.batch_size)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step)
        with autocast(args):
            share_loss, share_correct, share_count = scored(trained(parallel.share(tokens)), parallel.share(targets))
        loss, correct, count = parallel.total(share_loss.item(), share_correct, share_count)
        loss /= count
        if not math.isfinite(loss):  # on every rank alike, the sums being the world's
            progress.close()
            raise FloatingPointError(f"flat.train: {variant}: the loss is {loss} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        (share_loss * (parallel.world / count)).backward()
        gradient_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # before clipping
        optimizer.step()
        tokens_seen += tokens.numel()
        elapsed = time.perf_counter() - start
        postfix = {"loss": f"{loss:.3f}", "acc": f"{correct / max(count, 1):.3f}",
                   "tok/s": f"{tokens_seen / elapsed:,.0f}"}
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            result = evaluate(args, model, scoring["held_out"], parallel)
            if "training" in scoring:
                curves["training_bpc"].append(evaluate(args, model, scoring["training"], parallel)["bpc"])
            curves["step"].append(step + 1)
            curves["loss"].append(loss)
            curves["gradient_norm"].append(gradient_norm.item())
            curves["held_out_loss"].append(result["loss"])
            curves[metric].append(result[metric])
            postfix["held-out " + metric] = f"{result[metric]:.3f}"
            progress.note(step + 1, postfix)
            if args.stop_at is not None and result[metric] >= args.stop_at:  # the world's result: every rank stops
                break
        progress.step(postfix)
    progress.close()
    seconds = time.perf_counter() - start
    extra = {}
    if metric == "accuracy":  # how fast it learns, where the final accuracies all saturate
        extra["steps_to_90"] = next((s for s, a in zip(curves["step"], curves["accuracy"]) if a >= 0.9), None)
    else:  # as many windows of the text it trained on, scored the same way
        extra["training_bpc"] = curves["training_bpc"][-1]
    return {**extra, metric: curves[metric][-1], "held_out_loss": curves["held_out_loss"][-1], "curves": curves,
            "seconds": seconds, "tokens_per_second": tokens_seen / seconds,
            "parameters": sum(p.numel() for p in model.parameters()), "state_floats": state_floats(model)}


def save_checkpoint(args, variant: str, model: LanguageModel) -> Optional[str]:
    if not args.checkpoint_dir:
        return None
    from safetensors.torch import save_file
    directory = Path(args.checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{args.task}-{variant}.safetensors"
    save_file({name: t.detach().contiguous() for name, t in model.state_dict().items()}, str(path),
              metadata={"task": args.task, "variant": variant})
    return str(path)


def settings(args, parallel: Parallel) -> dict:
    keys = ("task", "text", "steps", "seq_len", "pairs", "vocab_size", "batch_size", "lr", "hidden_size", "layers",
            "heads", "state_size", "dtype", "precision", "seed", "threads", "eval_every", "stop_at",
            "context_parallel")
    return {**{k: getattr(args, k) for k in keys}, "processes": parallel.world}
