"""python -m flat.bench --transformers [--quick] [--repeats N] [--json FILE]

Hugging Face transformers' linear-attention models as transformers runs them on the CPU (its
PyTorch path: the reference chunked Gated DeltaNet and Mamba-2 scans, F.conv1d, the gated norm's
formula) against the same models with flat's kernels swapped in (flat.transformers.enable()),
side by side in one process on the same weights and inputs, bf16 and fp32, PyTorch's threads,
the CPU's default floating-point mode (no process-wide flush-to-zero):

- qwen3_5: Qwen3_5ForCausalLM, 4 layers (3 Gated DeltaNet, then 1 gated attention through SDPA),
  hidden 1024, 16 value heads and 8 key heads of 128, 4-tap convolution, MLP 3072, attention 8
  heads of 256 (2 KV heads), vocabulary 32768 tied to the embedding: 104M parameters;
- mamba2: Mamba2ForCausalLM, 10 Mamba-2 layers, hidden 1024 (2048 inner: 32 heads of 64), state
  128, one group, 4-tap convolution, chunk 256, vocabulary 32768 tied: 100M parameters.

Both are randomly initialised here (nothing is downloaded). Measured, each the median of --repeats
runs after one warm-up run (a run over 10 s is its own warm-up, and runs stop once they have taken
60 s: the torch path's bf16 prefill of 8192 tokens takes minutes on a small CPU), the two paths
taking turns run by run (medians_s):

- prefill tokens/s at 512, 2048 and 8192 tokens: model(input_ids), batch 1, under
  torch.inference_mode() (logits for every token, as that call returns them);
- decode tokens/s at batch 1 and 16: a 32-token prefill fills the model's cache (not timed), then
  32 single-token steps model(token, cache=cache) through it, timed;
- a training step over 1024 tokens: model(input_ids, labels=input_ids).loss.backward(), ms;
- the share of prefill time (2048 tokens) in the linear-attention layers: forward pre/post hooks
  on each mixer module and on its in_proj*/out_proj Linear modules, the mixers' time less their
  projections' over the whole forward's (the torch path's share bounds what swapping those
  layers can gain, at 1 / (1 - share), which is printed);
- where flat's time in those layers goes: torch.profiler's self time of the operations run inside
  a mixer and outside its projections (the hooks open record_function ranges), prefill 2048,
  by piece: the recurrence, the convolution and the fused gated norm (flat's operations), the gated
  norm (the mixer's norm module, where flat has not swapped the layer whole), copies and casts,
  the gates and other element-wise operations.

--quick runs tiny models at tiny lengths (seconds): for tests, not numbers.
"""

import copy
import json
import statistics
import time
import warnings

import torch

import flat
import flat.transformers as ftr

# The two paths every row measures: transformers' own PyTorch path, and flat's kernels swapped in.
PATHS = ("torch", "flat")
PROJECTION_PREFIXES = ("in_proj", "out_proj")
# What flat.transformers.enable warned of (functions it left on transformers' path), for the report.
ENABLE_WARNINGS = set()


def flat_path(on, model):
    """Switch transformers' linear-attention layers between flat's kernels and transformers' own
    PyTorch path (process-wide); returns the model to call."""
    if not on:
        ftr.disable()
        return model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = ftr.enable(model) or model
    ENABLE_WARNINGS.update(str(w.message) for w in caught)
    return model


def shapes(quick):
    """Per model: (description, constructor), and the lengths measured."""
    from transformers import Mamba2Config, Mamba2ForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if quick:
        qwen = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=64, linear_num_value_heads=4, linear_num_key_heads=2,
                    linear_key_head_dim=32, linear_value_head_dim=32)
        mamba = dict(vocab_size=512, hidden_size=128, num_heads=8, head_dim=32, state_size=32,
                     num_hidden_layers=2, chunk_size=64)
        lengths = dict(prefill=(32, 64, 128), prompt=4, steps=2, batches=(1, 16), train=64, share=64)
    else:
        qwen = dict(vocab_size=32768, hidden_size=1024, intermediate_size=3072, num_attention_heads=8,
                    num_key_value_heads=2, head_dim=256, linear_num_value_heads=16, linear_num_key_heads=8,
                    linear_key_head_dim=128, linear_value_head_dim=128)
        mamba = dict(vocab_size=32768, hidden_size=1024, num_heads=32, head_dim=64, state_size=128,
                     num_hidden_layers=10, chunk_size=256)
        lengths = dict(prefill=(512, 2048, 8192), prompt=32, steps=32, batches=(1, 16), train=1024, share=2048)

    def qwen3_5():
        config = Qwen3_5TextConfig(num_hidden_layers=4, linear_conv_kernel_dim=4, tie_word_embeddings=True,
                                   layer_types=["linear_attention"] * 3 + ["full_attention"], **qwen)
        config._attn_implementation = "sdpa"
        return Qwen3_5ForCausalLM(config)

    def mamba2():
        return Mamba2ForCausalLM(Mamba2Config(expand=2, n_groups=1, conv_kernel=4, tie_word_embeddings=True,
                                              **mamba))

    return {"qwen3_5": qwen3_5, "mamba2": mamba2}, lengths


def mixers(model):
    """The linear-attention mixers (a module with in_proj* and out_proj Linear children: Gated
    DeltaNet, Mamba-2; attention has q_proj/o_proj) and their projections."""
    found = []
    for module in model.modules():
        children = dict(module.named_children())
        projections = [m for name, m in children.items()
                       if name.startswith(PROJECTION_PREFIXES) and isinstance(m, torch.nn.Linear)]
        if "out_proj" in children and any(name.startswith("in_proj") for name in children):
            found.append((module, projections))
    return found


class Hooks:
    """Forward pre/post hooks on every mixer, its projections and its gated norm: their wall time
    (perf_counter), and record_function ranges for the profiler. Not on the norm of a layer flat
    swaps whole: its forward runs flat's fused norm only where the norm module has no hooks, so a
    hook there would measure the module's forward instead (flat's norm op is told apart by name)."""

    def __init__(self, model):
        self.seconds = {"mixer": 0.0, "projection": 0.0, "norm": 0.0}
        self.calls = {"mixer": 0, "projection": 0, "norm": 0}
        self.handles = []
        self.open = []
        for mixer, projections in mixers(model):
            self._hook(mixer, "mixer")
            for projection in projections:
                self._hook(projection, "projection")
            swapped_whole = getattr(type(mixer).forward, "flat_original", None) is not None
            if isinstance(getattr(mixer, "norm", None), torch.nn.Module) and not swapped_whole:
                self._hook(mixer.norm, "norm")

    def _hook(self, module, kind):
        def pre(module, args):
            scope = torch.profiler.record_function(f"flat.bench: {kind}")
            scope.__enter__()
            self.open.append((scope, time.perf_counter()))

        def post(module, args, output):
            scope, start = self.open.pop()
            elapsed = time.perf_counter() - start
            scope.__exit__(None, None, None)
            self.seconds[kind] += elapsed
            self.calls[kind] += 1

        self.handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def remove(self):
        for handle in self.handles:
            handle.remove()


# A call this long is its own warm-up (its one-time costs, milliseconds, are lost in it), and runs
# stop once they have taken BUDGET_S (at least one run): the torch path's bf16 prefill of 8192
# tokens takes minutes on a small CPU.
LONG_S = 10.0
BUDGET_S = 60.0


def medians_s(runs, repeats):
    """Per path, the median time of up to `repeats` calls of runs[path]() after one warm-up call
    (see LONG_S, BUDGET_S), the paths taking turns call by call, so that a shared machine's drift
    over minutes falls on both alike. A run returns its own time in seconds (so that it can leave
    setup out) or None to be timed whole; one that runs out of memory ends its path's calls and
    gives None."""
    def timed(run):
        start = time.perf_counter()
        own = run()
        return own if own is not None else time.perf_counter() - start

    times, failed = {path: [] for path in runs}, set()

    def turn(path, warm_up):
        try:
            seconds = timed(runs[path])
        except (RuntimeError, MemoryError) as error:
            if not out_of_memory(error):
                raise
            failed.add(path)
            return
        if not warm_up or seconds > LONG_S:
            times[path].append(seconds)

    def wanted(path):
        done = times[path]
        return path not in failed and len(done) < repeats and (not done or sum(done) < BUDGET_S)

    for path in runs:
        turn(path, warm_up=True)
    while any(wanted(path) for path in runs):
        for path in runs:
            if wanted(path):
                turn(path, warm_up=False)
    return {path: None if path in failed else statistics.median(times[path]) for path in runs}


def limit_memory(share=0.9):
    """Cap the address space at what is there now plus `share` of the memory available, so that a
    measurement that needs more (the torch path's Mamba-2 scan materialises [chunks, 256, 256, heads,
    state] products: 17 GB in bf16 at 8192 tokens) fails with an error that is caught and reported,
    not with the kernel's OOM killer ending the run."""
    import resource

    def kib(path, field):
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return None

    available, size = kib("/proc/meminfo", "MemAvailable"), kib("/proc/self/status", "VmSize")
    if available is None or size is None:
        return None
    limit = 1024 * (size + int(share * available))
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def out_of_memory(error):
    return isinstance(error, MemoryError) or (isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def measurements(lengths):
    """(key, row label, unit) of every row, in order."""
    rows = [(("prefill", T), f"prefill {T} tokens", "tokens/s") for T in lengths["prefill"]]
    rows += [(("decode", B), f"decode batch {B}", "tokens/s") for B in lengths["batches"]]
    rows.append((("train", lengths["train"]), f"training step {lengths['train']} tokens", "ms"))
    rows.append((("share", lengths["share"]), f"linear-attention share of prefill {lengths['share']}", "%"))
    return rows


def selected(args, builders, dtypes, rows):
    """The models, dtypes and rows that --models, --dtype and --rows ask for (all when not given)."""
    def pick(option, value, choices):
        if value is None:
            return list(choices)
        asked = value.split(",")
        unknown = [name for name in asked if name not in choices]
        if unknown or not asked:
            raise SystemExit(f"python -m flat.bench --transformers: {option} expects some of "
                             f"{','.join(choices)}, got {value!r}")
        return asked

    models = pick("--models", args.models, builders)
    dtype_names = pick("--dtype", {"f32": "fp32"}.get(args.dtype, args.dtype), dtypes)
    kinds = pick("--rows", args.rows, dict.fromkeys(key[0] for key, _, _ in rows))
    return ({name: builders[name] for name in models}, {name: dtypes[name] for name in dtype_names},
            [row for row in rows if row[0][0] in kinds])


def measure(models, key, lengths, repeats, vocab):
    """One row's numbers, per path: models[path]() switches to the path and returns the model to
    call."""
    kind, n = key
    generator = torch.Generator().manual_seed(1)
    if kind == "share":
        result = {}
        for path, model in models.items():
            try:
                result[path] = share(model(), n, repeats, vocab, generator)
            except (RuntimeError, MemoryError) as error:
                if not out_of_memory(error):
                    raise
                result[path] = None
        return result
    if kind == "prefill":
        ids = torch.randint(0, vocab, (1, n), generator=generator)

        def runner(model):
            def run():
                with torch.inference_mode():
                    model()(ids)
            return run

        value = lambda seconds: n / seconds
    elif kind == "decode":
        prompt = torch.randint(0, vocab, (n, lengths["prompt"]), generator=generator)
        steps = torch.randint(0, vocab, (lengths["steps"], n, 1), generator=generator)

        def runner(model):
            def run():
                with torch.inference_mode():
                    chosen = model()
                    cache = chosen(prompt, use_cache=True, logits_to_keep=1).cache
                    start = time.perf_counter()
                    for token in steps:
                        cache = chosen(token, cache=cache, use_cache=True).cache
                    return time.perf_counter() - start
            return run

        value = lambda seconds: n * lengths["steps"] / seconds
    elif kind == "train":
        ids = torch.randint(0, vocab, (1, n), generator=generator)

        def runner(model):
            def run():
                chosen = model()
                chosen.zero_grad(set_to_none=True)
                chosen.train()
                try:
                    chosen(ids, labels=ids).loss.backward()
                finally:
                    chosen.zero_grad(set_to_none=True)
                    chosen.eval()
            return run

        value = lambda seconds: 1e3 * seconds
    else:
        raise ValueError(kind)
    seconds = medians_s({path: runner(model) for path, model in models.items()}, repeats)
    return {path: None if s is None else value(s) for path, s in seconds.items()}


def share(model, n, repeats, vocab, generator):
    """The percentage of a prefill of n tokens spent in the linear-attention layers (outside their
    projections), from the hooks."""
    ids = torch.randint(0, vocab, (1, n), generator=generator)
    # The prefill of n tokens has run (and warmed up) in its own row; runs as medians_s's.
    with torch.inference_mode():
        hooks = Hooks(model)
        try:
            whole = 0.0
            for _ in range(repeats):
                start = time.perf_counter()
                model(ids)
                whole += time.perf_counter() - start
                if whole > BUDGET_S:
                    break
        finally:
            hooks.remove()
    if hooks.calls["mixer"] == 0 or hooks.calls["projection"] == 0:
        raise RuntimeError("the linear-attention mixers or their projections were not called as modules")
    return 100 * (hooks.seconds["mixer"] - hooks.seconds["projection"]) / whole


COPIES = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::contiguous", "aten::clone", "aten::empty",
          "aten::empty_strided", "aten::empty_like", "aten::zeros", "aten::new_empty", "aten::cat", "aten::pad",
          "aten::constant_pad_nd")


def piece(name, scope):
    """Which part of a linear-attention layer a profiled operation belongs to."""
    if scope == "norm":
        return "gated norm (the norm module)"
    if name.startswith("flat::") and "conv" in name:
        return "convolution (flat)"
    if name.startswith("flat::norm_gate"):
        return "gated norm (flat)"
    if name.startswith("flat::"):
        return "recurrence (flat)"
    if name in COPIES:
        return "copies, casts, allocations"
    return "gates and other element-wise operations"


def breakdown(model, n, vocab, generator):
    """Where the time inside the mixers and outside their projections goes, from torch.profiler's
    self time over one prefill of n tokens: by piece, and the operations by name, ms per prefill."""
    ids = torch.randint(0, vocab, (1, n), generator=generator)
    with torch.inference_mode():
        model(ids)
        hooks = Hooks(model)
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
                model(ids)
        finally:
            hooks.remove()
    pieces, operations = {}, {}
    for event in profile.events():
        if event.name.startswith("flat.bench: "):
            continue
        scopes, parent = [], event.cpu_parent
        while parent is not None:
            if parent.name.startswith("flat.bench: "):
                scopes.append(parent.name[len("flat.bench: "):])
            parent = parent.cpu_parent
        if "mixer" not in scopes or "projection" in scopes:
            continue
        scope = "norm" if "norm" in scopes else "mixer"
        ms = event.self_cpu_time_total / 1e3
        key = piece(event.name, scope)
        pieces[key] = pieces.get(key, 0.0) + ms
        operations[event.name] = operations.get(event.name, 0.0) + ms
    return (sorted(pieces.items(), key=lambda item: -item[1]),
            sorted(operations.items(), key=lambda item: -item[1]))


def transformers_bench(args):
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety
        tqdm = None
    import transformers

    transformers.logging.set_verbosity_error()
    quick = args.quick
    repeats = args.repeats
    limit = None if quick else limit_memory()
    builders, lengths = shapes(quick)
    rows = measurements(lengths)
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    builders, dtypes, rows = selected(args, builders, dtypes, rows)
    # Where flat's layers' time goes, profiled beside the share row.
    profile = any(key[0] == "share" for key, _, _ in rows)
    threads = torch.get_num_threads()
    print(f"flat.bench --transformers{' --quick' if quick else ''}: {threads} threads (PyTorch's), "
          f"target {flat.target()}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"medians of {repeats} runs after a warm-up"
          + (f", address space capped at {limit / 2**30:.1f} GiB" if limit else ""))
    bar = None
    total = len(builders) * len(dtypes) * len(rows) * len(PATHS) + len(builders) * len(dtypes) * profile
    if tqdm is not None:
        bar = tqdm(total=total, unit="run", dynamic_ncols=True)
    results = {"threads": threads, "target": flat.target(), "torch": torch.__version__,
               "transformers": transformers.__version__, "quick": quick, "repeats": repeats,
               "models": {}, "rows": [], "breakdown": []}
    try:
        for name, build in builders.items():
            torch.manual_seed(0)
            base = build().eval()
            vocab = base.config.vocab_size
            results["models"][name] = dict(parameters=sum(p.numel() for p in base.parameters()),
                                           config=base.config.to_diff_dict())
            for dtype_name, dtype in dtypes.items():
                model = copy.deepcopy(base).to(dtype)
                for key, label, unit in rows:
                    row = dict(model=name, dtype=dtype_name, measurement=label, unit=unit)
                    if bar is not None:
                        bar.set_description(f"{name} {dtype_name} {label}")
                    models = {path: (lambda on=(path == "flat"): flat_path(on, model)) for path in PATHS}
                    row.update(measure(models, key, lengths, repeats, vocab))
                    for path in PATHS:
                        if row[path] is None:
                            row.setdefault("failed", {})[path] = "out of memory"
                    if bar is not None:
                        bar.update(len(PATHS))
                    results["rows"].append(row)
                    # As it comes, so that a run cut short leaves its numbers.
                    (bar.write if bar is not None else print)("row: " + json.dumps(row))
                if profile:
                    if bar is not None:
                        bar.set_description(f"{name} {dtype_name} profile of flat's layers")
                    run_model = flat_path(True, model)
                    pieces, operations = breakdown(run_model, lengths["share"], vocab,
                                                   torch.Generator().manual_seed(1))
                    results["breakdown"].append(dict(model=name, dtype=dtype_name, tokens=lengths["share"],
                                                     pieces=dict(pieces), operations=dict(operations)))
                    if bar is not None:
                        bar.update()
                del model
            del base
    finally:
        if bar is not None:
            bar.close()
        flat_path(False, None)
    results["enable_warnings"] = sorted(ENABLE_WARNINGS)
    for message in results["enable_warnings"]:
        print(f"\n{message}")
    print_tables(results)
    return results


def ratio(row):
    """flat's speed over the torch path's (times inverted), None for the share."""
    if row["unit"] == "%" or row["flat"] is None or row["torch"] is None:
        return None
    return row["torch"] / row["flat"] if row["unit"] == "ms" else row["flat"] / row["torch"]


def print_tables(results):
    for name, model in results["models"].items():
        print(f"\n{name}: {model['parameters'] / 1e6:.1f}M parameters")
    print("\n| model | dtype | measurement | unit | torch path | flat | flat / torch |")
    print("|---|---|---|---|---:|---:|---:|")
    def cell(value):
        return "out of memory" if value is None else f"{value:.1f}" if value < 1e4 else f"{value:.0f}"

    for row in results["rows"]:
        speedup = ratio(row)
        cells = [cell(row[p]) for p in PATHS] + ["" if speedup is None else f"x{speedup:.2f}"]
        print(f"| {row['model']} | {row['dtype']} | {row['measurement']} | {row['unit']} | " + " | ".join(cells) + " |")
    print("\n(flat / torch: flat's tokens/s over the torch path's; for the training step, the torch path's ms "
          "over flat's)")
    for row in results["rows"]:
        if row["unit"] == "%" and row.get("torch") is not None:
            print(f"\n{row['model']} {row['dtype']}: the torch path spends {100 - row['torch']:.0f}% of its prefill "
                  f"outside the linear-attention layers, which bounds what swapping them can gain at "
                  f"x{100 / (100 - row['torch']):.2f}")
    for entry in results["breakdown"]:
        whole = sum(entry["pieces"].values())
        print(f"\nflat's linear-attention layers, {entry['model']} {entry['dtype']}, prefill {entry['tokens']} "
              f"(profiler self time inside the mixers, projections left out): {whole:.1f} ms")
        print("| piece | ms | share |")
        print("|---|---:|---:|")
        for name, ms in entry["pieces"].items():
            print(f"| {name} | {ms:.2f} | {100 * ms / whole:.0f}% |")
        top = list(entry["operations"].items())[:6]
        print("(the most time: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in top) + ")")


def write_json(results, path):
    with open(path, "w") as f:
        json.dump(results, f, indent=2, default=str)
