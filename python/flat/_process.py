"""How a process that ran a gloo process group ends.

A finished collective's work object is released by one of gloo's worker threads, some time after
the caller's wait returned. When it holds the last reference to a tensor that Python had, the
release takes the GIL; if the interpreter is finalizing by then, CPython ends that thread inside a
noexcept destructor and the process aborts ("terminate called without an active exception"; a core
of flat.bench --context-parallel showed c10d::ProcessGroupGloo::runLoop destroying an
AsyncBarrierWork under Py_FinalizeEx; pytorch/pytorch#179291). About one run in forty did so on
our 2-core machines.

Only a group still alive at finalization has such threads: destroy_process_group destroys the group,
joining its threads, once nothing else references it. PyTorch's torch.distributed.nn.functional
references the default group when it is imported while one is up (its functions' default argument
``group=group.WORLD``), and the first call of any custom op imports it (through torch._dynamo): in
flat's workers that was the first flat.torch call, so the group lived on. flat.context_parallel
imports it with flat.torch, before init_process_group, so it holds None. A group a script still
references (its own variables, a context_parallel(group) given it and the outputs of its calls)
lives on all the same, so a process whose work is done, results handed over and process group
destroyed, ends without finalization: flat's bench and test workers and flat.train's ranks."""

import os
import sys


def exit_after_process_group(status: int = 0) -> None:
    """Flushes stdout and stderr and ends the process with `status`, skipping the interpreter's
    finalization (see the module's docstring). Call it only once every file is closed and every
    result handed over."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
