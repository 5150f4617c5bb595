"""Other packages' functions on flat's kernels, with those packages' exact signatures, defaults,
layouts and return values, for CPU tensors: ``flat.compat.fla`` (flash-linear-attention 0.6),
``flat.compat.causal_conv1d`` and ``flat.compat.mamba_ssm``. They are what ``flat.transformers``
plugs into Hugging Face transformers' models, and what code written against those packages calls
on a CPU."""
