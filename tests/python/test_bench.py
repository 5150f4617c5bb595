"""python -m flat.bench at a tiny shape: every section runs through the current bindings and
writes its numbers, the gates section with both gate draws of both variants; the models' gates
are as strong as the models' (a chunk's decays reach the subnormal range)."""

import json
import os
import subprocess
import sys

import torch

from flat.bench.gates import model_gates


def test_model_gates_are_the_models_draw():
    torch.manual_seed(0)
    per_head = model_gates(2, 64, 4, 64, per_channel=False)
    per_channel = model_gates(2, 64, 4, 64, per_channel=True)
    assert per_head.shape == (2, 64, 4) and per_channel.shape == (2, 64, 4, 64)
    for g in (per_head, per_channel):
        assert torch.isfinite(g).all() and (g < 0).all()
        # No token decays by more than A = 16 times softplus of its largest input.
        assert g.min() > -16 * 20
    # Over the 256 channels, some chunk of 64 tokens decays below fp32's normal range (exp(-87.3)):
    # the strength that makes the chunk's decay factors subnormal.
    assert per_channel.sum(1).min() < -87.3


def test_bench_writes_every_section(tmp_path):
    out = tmp_path / "bench.json"
    # In a process of its own: --keep-subnormals is read by the library at its first call.
    for extra in ([], ["--keep-subnormals"]):
        run = subprocess.run([sys.executable, "-m", "flat.bench", "--shape", "1,64,2,16,16", "--repeats", "1",
                              "--no-compile", "--json", str(out), *extra],
                             capture_output=True, text=True, timeout=600, env=dict(os.environ))
        assert run.returncode == 0, run.stderr
        results = json.loads(out.read_text())
        assert [row["name"] for row in results["overhead"]] == ["forward", "backward"]
        assert len(results["implementations"]) == 2
        gates = [(row["variant"], row["gates"]) for row in results["gates"]]
        assert gates == [("gated_deltanet", "weak"), ("gated_deltanet", "model"), ("kda", "weak"), ("kda", "model")]
        for row in results["gates"]:
            assert row["forward_ms"] > 0 and row["forward_backward_ms"] > 0
        assert ("kept (--keep-subnormals)" in run.stdout) == bool(extra)


def test_bench_transformers_quick(tmp_path):
    """python -m flat.bench --transformers --quick: tiny Qwen3.5 and Mamba-2 models, every row of
    the table there for both dtypes with a positive number for each path, and the profile of
    flat's layers for each model and dtype."""
    import pytest

    pytest.importorskip("transformers")
    from flat.bench.models import PATHS, measurements, shapes

    out = tmp_path / "transformers.json"
    run = subprocess.run([sys.executable, "-m", "flat.bench", "--transformers", "--quick", "--repeats", "1",
                          "--json", str(out)], capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())
    labels = [label for _, label, _ in measurements(shapes(quick=True)[1])]
    expected = [(model, dtype, label) for model in ("qwen3_5", "mamba2") for dtype in ("bf16", "fp32")
                for label in labels]
    assert [(row["model"], row["dtype"], row["measurement"]) for row in results["rows"]] == expected
    for row in results["rows"]:
        for path in PATHS:
            assert row[path] > 0, row
    for model, dtype, label in expected:
        assert f"| {model} | {dtype} | {label} |" in run.stdout
    assert len(results["breakdown"]) == 4 and all(entry["operations"] for entry in results["breakdown"])


def test_bench_transformers_selection():
    """--models, --dtype and --rows pick the models, dtypes and rows of the transformers bench, in
    the table's order; a name it does not have stops the run with a message naming the option."""
    import argparse

    import pytest

    pytest.importorskip("transformers")
    from flat.bench.models import measurements, selected, shapes

    builders, lengths = shapes(quick=True)
    rows = measurements(lengths)
    dtypes = {"bf16": "bf16 dtype", "fp32": "fp32 dtype"}

    def pick(models=None, dtype=None, kinds=None):
        args = argparse.Namespace(models=models, dtype=dtype, rows=kinds)
        return selected(args, builders, dtypes, rows)

    models, chosen_dtypes, chosen_rows = pick()
    assert list(models) == ["qwen3_5", "mamba2"] and chosen_dtypes == dtypes and chosen_rows == rows
    models, chosen_dtypes, chosen_rows = pick("mamba2", "f32", "share,decode")
    assert list(models) == ["mamba2"] and chosen_dtypes == {"fp32": "fp32 dtype"}
    assert [key[0] for key, _, _ in chosen_rows] == ["decode", "decode", "share"]
    for option, value in (("--models", "qwen"), ("--rows", "prefill,decoding")):
        with pytest.raises(SystemExit, match=f"{option} expects some of .*, got '{value}'"):
            pick(**{"models" if option == "--models" else "kinds": value})


def test_bench_context_parallel(tmp_path):
    """python -m flat.bench --context-parallel at a tiny shape: a row per process count with every
    time positive, and the bytes each rank sends those of the formula: the forward's ranks' four
    integers then one all-gather of B H K (V + K) + 1 floats, the backward's one all-reduce of world
    times that."""
    out = tmp_path / "context_parallel.json"
    run = subprocess.run([sys.executable, "-m", "flat.bench", "--context-parallel", "--cp-shape", "1,64,2,8,16",
                          "--variants", "gated_deltanet", "--repeats", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())
    assert [(row["variant"], row["processes"]) for row in results["rows"]] == [("gated_deltanet", 1),
                                                                              ("gated_deltanet", 2)]
    states = 4 * (1 * 2 * 8 * (16 + 8) + 1)
    for row in results["rows"]:
        world = row["processes"]
        assert row["formula_states_bytes"] == states and row["formula_backward_bytes"] == world * states
        assert row["forward_all_gathers_bytes"] == [4 * 8, states] and row["forward_all_reduces_bytes"] == []
        assert row["backward_all_gathers_bytes"] == [] and row["backward_all_reduces_bytes"] == [world * states]
        for name in ("context_parallel_forward_ms", "context_parallel_forward_backward_ms", "local_forward_ms",
                     "transition_forward_backward_ms", "all_gather_ms", "all_reduce_ms"):
            assert row[name] > 0, name
    assert results["rows"][0]["whole_forward_ms"] > 0
