"""flat's Python benchmarks, python -m flat.bench (flat/bench/__main__.py: the command and what each
section times): the binding and flat.torch's kernels in kernels.py, transformers' models in models.py
(--transformers), flat.torch.context_parallel in context_parallel.py (--context-parallel); the
models' gates they share in gates.py. Nothing in the library imports them."""
