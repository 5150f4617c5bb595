"""A two-rank gloo script as a user writes it (test_context_parallel.py runs it): python
context_parallel_user.py RANK WORLD PORT. A few flat.torch.context_parallel calls forward and
backward, a barrier, destroy_process_group, then the interpreter's own exit (no os._exit). Prints the
gloo threads still running after destroy_process_group (Linux; None elsewhere), given up to 10 s to
end: the group's threads end as it is destroyed, but one may still be listed for a moment after
(gloo_tcp_loop, 1 script run in about 300 on a loaded EPYC Zen 3); any left after that run on into the
interpreter's finalization, which they can abort."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import flat.torch as ft


def gloo_threads():
    """The names of this process's gloo threads (None where /proc does not list them)."""
    if not os.path.isdir("/proc/self/task"):
        return None
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(name for name in names if "gloo" in name)


rank, world, port = (int(a) for a in sys.argv[1:4])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
torch.manual_seed(rank)
cp = ft.context_parallel()
for step in range(2):
    q, k = (torch.randn(1, 8, 2, 8, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 8, 2, 8, requires_grad=True)
    g = (-torch.rand(1, 8, 2)).requires_grad_()
    beta = torch.rand(1, 8, 2, requires_grad=True)
    o, final_state = cp.gated_deltanet(q, k, v, g, beta, output_final_state=True)
    (o.sum() + final_state.sum()).backward()
dist.barrier()
dist.destroy_process_group()
deadline = time.monotonic() + 10
while gloo_threads() and time.monotonic() < deadline:
    time.sleep(0.01)
print(f"gloo threads after destroy_process_group: {gloo_threads()}", flush=True)
