"""How a process that ran a gloo process group ends.

A finished collective's work object is released by one of gloo's worker threads, some time after
the caller's wait returned. When it holds the last reference to a tensor that Python had, the
release takes the GIL; if the interpreter is finalizing by then, CPython ends that thread inside a
noexcept destructor and the process aborts ("terminate called without an active exception"; a core
of flat.bench --context-parallel showed c10d::ProcessGroupGloo::runLoop destroying an
AsyncBarrierWork under Py_FinalizeEx; pytorch/pytorch#179291). About one run in forty did so on
our 2-core machines. A process whose work is done, results handed over and process group destroyed,
ends without finalization instead."""

import os
import sys


def exit_after_process_group(status: int = 0) -> None:
    """Flushes stdout and stderr and ends the process with `status`, skipping the interpreter's
    finalization (see the module's docstring). Call it only once every file is closed and every
    result handed over."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
