"""python -m flat.bench --context-parallel [--cp-shape B,T,H,K,V] [--variants V,..] [--dtype bf16|f32]
                     [--repeats N] [--json FILE]

flat.torch.context_parallel (python/flat/torch/parallel.py) on 1 and 2 processes of one thread
each (gloo on loopback), one sequence of T tokens cut evenly, gates as the models draw them
(flat/bench/gates.py's model_gates; Gated DeltaNet with the in-kernel L2 norm of q and k). Per variant and
process count, the medians of --repeats runs, each run begun by a barrier and its time the slowest
rank's:

- the context-parallel call, forward (no gradient) and forward+backward;
- its pieces, timed alone on the rank's share: the local pass (flat.torch on the share from a
  given state, V wide: the work without context parallelism), the transition pass (the share from
  [0, I] with the values widened by K zero columns, the one pass the call runs: its final state and
  transition [S, M], and its output's two parts), and the collectives (an all-gather of the call's
  payload; in the backward an all-reduce of the gathered size);
- the bytes each rank sends per call, counted on the collectives the call makes (the forward's
  two all-gathers: the ranks' four integers, then the states; the backward's all-reduce), against
  the formula: B H K (V + K) + 1 floats per rank (the share's S and M, and a flag) in the
  all-gather, world times that in the all-reduce;
- flat.torch on the whole sequence in one process of one thread.

The transition's cost is the transition pass less the local pass: the issue's bar is at most one
extra forward's worth (transition / local <= 2).
"""

import datetime
import json
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flat
import flat.torch as ft

from flat._process import exit_after_process_group
from flat.torch.parallel import _widened

from .gates import model_gates

VARIANTS = ("gla", "gated_deltanet")


def _inputs(variant, B, T, H, K, V, dtype):
    """The variant's inputs [B, T, H, .] as a model gives them, the same on every rank (seeded)."""
    torch.manual_seed(0)
    q, k = (torch.randn(B, T, H, K, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, dtype=dtype)
    if variant == "gla":
        return dict(q=q, k=k, v=v, g=model_gates(B, T, H, K, per_channel=True))
    return dict(q=q, k=k, v=v, g=model_gates(B, T, H, K, per_channel=False),
                beta=torch.rand(B, T, H, dtype=dtype), use_qk_l2norm_in_kernel=True)


def _share(inputs, start, end):
    return {name: x[:, start:end] if isinstance(x, torch.Tensor) else x for name, x in inputs.items()}


def _leaves(inputs):
    return {name: x.clone().requires_grad_() if isinstance(x, torch.Tensor) else x for name, x in inputs.items()}


def _slowest_median_ms(function, repeats, group):
    """The median over `repeats` runs (after two warm-up runs) of the slowest rank's time, each
    run begun by a barrier."""
    times = []
    for run in range(repeats + 2):
        dist.barrier(group)
        start = time.perf_counter()
        function()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        if run >= 2:
            times.append(elapsed.item())
    return 1e3 * statistics.median(times)


class _CountedCollectives:
    """Records the bytes this rank sends through each dist.all_gather and dist.all_reduce while open."""

    def __enter__(self):
        self.sent = {"all_gather": [], "all_reduce": []}
        self.originals = {name: getattr(dist, name) for name in self.sent}
        for name, original in self.originals.items():
            def counted(tensor_or_list, *args, _name=name, _original=original, **kwargs):
                tensor = args[0] if _name == "all_gather" else tensor_or_list
                self.sent[_name].append(tensor.numel() * tensor.element_size())
                return _original(tensor_or_list, *args, **kwargs)
            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(dist, name, original)


def _worker(rank, world, port, args, variant, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        torch.set_num_threads(1)
        B, T, H, K, V = args.shape
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        share = T // world
        inputs = _share(_inputs(variant, B, T, H, K, V, dtype), rank * share, (rank + 1) * share)
        function, cp = getattr(ft, variant), getattr(ft.context_parallel(), variant)
        group = dist.group.WORLD

        def forward_backward(call, leaves, **kwargs):
            def run():
                o, final_state = call(**leaves, **kwargs)
                (o.float().sum() + final_state.sum()).backward()
            return run

        # The collectives the call makes, counted on one forward and one backward.
        leaves = _leaves(inputs)
        with _CountedCollectives() as forward_counts:
            o, final_state = cp(**leaves, output_final_state=True)
        with _CountedCollectives() as backward_counts:
            (o.float().sum() + final_state.sum()).backward()
        payload = B * H * K * (V + K) + 1  # floats per rank: the share's S and M, and a flag
        row = dict(variant=variant, processes=world, tokens_per_rank=share,
                   forward_all_gathers_bytes=forward_counts.sent["all_gather"],
                   forward_all_reduces_bytes=forward_counts.sent["all_reduce"],
                   backward_all_gathers_bytes=backward_counts.sent["all_gather"],
                   backward_all_reduces_bytes=backward_counts.sent["all_reduce"],
                   formula_states_bytes=4 * payload, formula_backward_bytes=4 * world * payload)

        with torch.no_grad():
            row["context_parallel_forward_ms"] = _slowest_median_ms(
                lambda: cp(**inputs, output_final_state=True), args.repeats, group)
        row["context_parallel_forward_backward_ms"] = _slowest_median_ms(
            forward_backward(cp, _leaves(inputs), output_final_state=True), args.repeats, group)

        state = torch.zeros(B, H, K, V)
        start = torch.cat([torch.zeros(B, H, K, V), torch.eye(K).expand(B, H, K, K)], dim=-1)
        widened = dict(inputs, v=_widened(inputs["v"], K, 0.0))
        for piece, piece_inputs, initial_state in (("local", inputs, state), ("transition", widened, start)):
            with torch.no_grad():
                row[f"{piece}_forward_ms"] = _slowest_median_ms(
                    lambda: function(**piece_inputs, initial_state=initial_state,  # noqa: B023
                                     output_final_state=True), args.repeats, group)
            row[f"{piece}_forward_backward_ms"] = _slowest_median_ms(
                forward_backward(function, _leaves(piece_inputs), initial_state=initial_state.clone().requires_grad_(),
                                 output_final_state=True), args.repeats, group)

        sent = torch.zeros(payload)
        received = [torch.zeros(payload) for _ in range(world)]
        gathered = torch.zeros(world * payload)
        row["all_gather_ms"] = _slowest_median_ms(lambda: dist.all_gather(received, sent), args.repeats, group)
        row["all_reduce_ms"] = _slowest_median_ms(lambda: dist.all_reduce(gathered), args.repeats, group)
        if world == 1:  # flat.torch on the whole sequence, no context parallelism
            with torch.no_grad():
                row["whole_forward_ms"] = _slowest_median_ms(lambda: function(**inputs, output_final_state=True),
                                                             args.repeats, group)
            row["whole_forward_backward_ms"] = _slowest_median_ms(
                forward_backward(function, _leaves(inputs), output_final_state=True), args.repeats, group)
        if rank == 0:
            results.put(row)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_after_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def context_parallel_bench(args):
    """Runs the table (the module's docstring) and returns its rows."""
    args.shape = tuple(int(x) for x in args.cp_shape.split(","))
    B, T, H, K, V = args.shape
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    for variant in variants:
        if variant not in VARIANTS:
            raise SystemExit(f"flat.bench --context-parallel: --variants: expected some of {','.join(VARIANTS)}, "
                             f"got '{variant}'")
    if T % 2:
        raise SystemExit(f"flat.bench --context-parallel: --cp-shape: T must be even (cut in two), got {T}")
    print(f"flat.bench --context-parallel: B={B} T={T} H={H} K={K} V={V} {args.dtype}, 1 thread per process, "
          f"target {flat.target()}, torch {torch.__version__}")
    context = mp.get_context("spawn")
    rows = []
    for variant in variants:
        for world in (1, 2):
            queue = context.SimpleQueue()
            mp.start_processes(_worker, args=(world, _free_port(), args, variant, queue), nprocs=world,
                               start_method="spawn")
            rows.append(queue.get())
    print("\n| variant | processes | tokens per rank | forward ms | fwd+bwd ms | local pass fwd / fwd+bwd ms | "
          "transition pass fwd / fwd+bwd ms | all-gather / all-reduce ms | bytes sent per rank: forward's "
          "all-gathers; backward's all-reduces (formula: states; all-reduce) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['processes']} | {r['tokens_per_rank']} | {r['context_parallel_forward_ms']:.1f} | "
              f"{r['context_parallel_forward_backward_ms']:.1f} | {r['local_forward_ms']:.1f} / "
              f"{r['local_forward_backward_ms']:.1f} | {r['transition_forward_ms']:.1f} / "
              f"{r['transition_forward_backward_ms']:.1f} | {r['all_gather_ms']:.3f} / {r['all_reduce_ms']:.3f} | "
              f"{' + '.join(map(str, r['forward_all_gathers_bytes']))}; "
              f"{' + '.join(map(str, r['backward_all_reduces_bytes']))} ({r['formula_states_bytes']}; "
              f"{r['formula_backward_bytes']}) |")
    print("\n| variant | one process, whole sequence fwd / fwd+bwd ms | two processes fwd / fwd+bwd ms | speedup | "
          "transition / local pass, fwd / fwd+bwd |")
    print("|---|---:|---:|---:|---:|")
    for variant in variants:
        one, two = (next(r for r in rows if r["variant"] == variant and r["processes"] == w) for w in (1, 2))
        print(f"| {variant} | {one['whole_forward_ms']:.1f} / {one['whole_forward_backward_ms']:.1f} | "
              f"{two['context_parallel_forward_ms']:.1f} / {two['context_parallel_forward_backward_ms']:.1f} | "
              f"x{one['whole_forward_ms'] / two['context_parallel_forward_ms']:.2f} / "
              f"x{one['whole_forward_backward_ms'] / two['context_parallel_forward_backward_ms']:.2f} | "
              f"{two['transition_forward_ms'] / two['local_forward_ms']:.2f} / "
              f"{two['transition_forward_backward_ms'] / two['local_forward_backward_ms']:.2f} |")
    return rows


def write_json(args, rows, path):
    with open(path, "w") as f:
        json.dump(dict(shape=dict(zip("BTHKV", args.shape)), dtype=args.dtype, threads_per_process=1,
                       target=flat.target(), rows=rows),
                  f, indent=2)
