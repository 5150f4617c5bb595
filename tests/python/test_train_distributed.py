"""flat.train under torchrun on gloo: data parallelism (DDP), context parallelism and both give one
process's curves within rounding; what cannot be split, or a world the groups do not divide, is
refused before any step.

The three multi-process runs start together (each is mostly the start of its processes, which
overlap) and are compared with one in-process run of the same settings. The batch (7 sequences)
and the sequence (13 tokens) divide unevenly, so the ranks' shares differ in size and in scored
positions: a loss normalised per rank instead of by the whole batch's count would show."""

import json
import os
import subprocess
import sys

import pytest

from flat.nn import REFERENCE
from flat.train import cli
from flat.train.model import LanguageModel

TINY = ["--task", "mqar", "--variants", "gated_deltanet", "--steps", "4", "--eval-every", "2", "--pairs", "4",
        "--seq-len", "13", "--batch-size", "7", "--checkpoint-dir", "", "--no-progress"]
# name: (processes, --context-parallel)
LAYOUTS = {"data 2": (2, 1), "context 2": (2, 2), "data 2 x context 2": (4, 2)}
HELD_OUT_POSITIONS = 1024 * 4  # MQAR's held-out sequences times the pairs each queries


@pytest.fixture(scope="module")
def one_process():
    return cli.main(TINY)["gated_deltanet"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The torchrun commands of every layout, started at once: name -> (process, its JSON log)."""
    directory = tmp_path_factory.mktemp("torchrun")
    runs = {}
    for name, (processes, context) in LAYOUTS.items():
        log = directory / f"{processes}-{context}.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                   "-m", "flat.train", *TINY, "--context-parallel", str(context), "--json", str(log)]
        runs[name] = (subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env={**os.environ, "OMP_NUM_THREADS": "1"}), log)
    yield runs
    for process, _ in runs.values():
        if process.poll() is None:
            process.terminate()  # torchrun ends its workers
            process.wait()


@pytest.mark.parametrize("name", LAYOUTS)
def test_torchrun_trains_as_one_process(name, launched, one_process):
    """Losses, gradient norms (before clipping: the gradient's scale, which AdamW's steps would hide)
    and held-out losses within a relative 1e-5 of one process's: the same float32 terms summed in
    another order (the ranks' shares, DDP's all-reduce, the context-parallel states folded) differ
    by about 1e-7 relative after four steps. Held-out accuracy to one prediction in the 4096 scored:
    a rounding-level difference may flip an argmax between two logits that tie to 1e-7."""
    process, log = launched[name]
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output
    data = json.loads(log.read_text())
    processes, context = LAYOUTS[name]
    assert data["settings"]["processes"] == processes and data["settings"]["context_parallel"] == context
    ours, one = data["results"]["gated_deltanet"]["curves"], one_process["curves"]
    assert ours["step"] == one["step"] == [2, 4]
    for key in ("loss", "gradient_norm", "held_out_loss"):
        assert ours[key] == pytest.approx(one[key], rel=1e-5), key
    assert ours["accuracy"] == pytest.approx(one["accuracy"], abs=1 / HELD_OUT_POSITIONS)
    assert "gated_deltanet" in output.splitlines()[-1]  # rank 0's table; the other ranks print nothing of it
    assert output.count("held-out accuracy") == 1 + len(one["step"])


@pytest.mark.parametrize("world, argv, message", [
    (2, ["--variants", "gla,softmax", "--context-parallel", "2"],
     "--context-parallel: softmax attention cannot split its sequences"),
    (4, ["--variants", "gla", "--context-parallel", "3"], "--context-parallel: expected a divisor of the 4 processes"),
    (1, ["--variants", "gla", "--context-parallel", "2"], "--context-parallel: expected a divisor of the 1 processes"),
    (2, ["--variants", "gla", "--context-parallel", "2", "--seq-len", "1"],
     "--seq-len 1: fewer tokens than the --context-parallel 2 ranks"),
    (4, ["--variants", "gla", "--batch-size", "3"], "--batch-size 3: fewer sequences than the 4 data-parallel ranks"),
])
def test_what_cannot_be_split_is_refused_before_any_step(world, argv, message, monkeypatch, capsys):
    """Each rank of a torchrun world refuses alike, from its arguments and WORLD_SIZE alone, before
    any process group or model."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(SystemExit) as exit:
        cli.main(["--task", "mqar", "--checkpoint-dir", "", "--no-progress"] + argv)
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_softmax_attention_takes_no_ops():
    with pytest.raises(ValueError, match="ops is for the linear-attention mixers"):
        LanguageModel("softmax", 32, 64, 1, 2, 4096, ops=REFERENCE)
