"""python/flat's import graph, read from the source with ast (no module is imported to build it): a
module imports another where it names it in an import statement anywhere in its file, relative
(``from . import ops``, ``from .. import torch``) or absolute (``import flat.torch``,
``from flat.nn.ops import Ops``), at module level or inside a function. A package's __init__ is a
module of the package's name; importing a submodule is an edge to the submodule only (Python runs
its package's __init__ first, which is not counted as the importer's choice).

The rules:

- no cycle;
- no late import: a module imports flat's modules at its top, before its first function or class,
  never inside a function body (a function-level import is the usual way to hide a cycle). A
  function may import third-party packages (torch, jax, transformers, tqdm, matplotlib,
  safetensors, resource), where the module must import without them or defers their cost;
- the bindings (flat, flat._core, flat._args, flat._api, flat._process) import only bindings: the
  front ends (flat.torch, flat.jax, flat.nn, flat.compat, flat.transformers) sit above them;
- the benches (flat.bench) and the trainer (flat.train) sit on top: nothing else imports them;
- each front end's context parallelism sits above its operations (flat.torch.parallel imports
  flat.torch.ops, flat.jax.parallel flat.jax.ops), and the public names stay where users have them.
"""

import ast
from pathlib import Path

import pytest

import flat.torch

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "flat"
EXTENSIONS = ("flat._core",)  # compiled modules, which import nothing of flat's
BINDINGS = {"flat", "flat._core", "flat._args", "flat._api", "flat._process"}
TOP = ("flat.bench", "flat.train")


def _module_name(path: Path) -> str:
    parts = ("flat",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


class _Imports(ast.NodeVisitor):
    """A module's imports of flat's modules: (imported module, line, inside a function) each."""

    def __init__(self, module: str, is_package: bool, modules: set):
        self.package = module if is_package else module.rpartition(".")[0]
        self.modules = modules
        self.depth = 0
        self.found = []

    def _resolve(self, name: str) -> str:
        """The module a dotted name names: its longest prefix that is one of flat's modules."""
        while name not in self.modules:
            name = name.rpartition(".")[0]
        return name

    def _add(self, name: str, node) -> None:
        if _within(name, "flat"):
            self.found.append((self._resolve(name), node.lineno, self.depth > 0))

    def visit_Import(self, node):
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node):
        if node.level:
            base = self.package.split(".")
            base = ".".join(base[:len(base) - (node.level - 1)])
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            self._add(candidate if candidate in self.modules else base, node)

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function


def _graph():
    """{module: [(imported module, line, inside a function)]}, and each module's late module-level
    imports of flat's modules (after its first function or class), as (module, line)."""
    sources = _sources()
    modules = set(sources) | set(EXTENSIONS)
    graph, late = {name: [] for name in EXTENSIONS}, []
    for name, path in sources.items():
        tree = ast.parse(path.read_text(), str(path))
        visitor = _Imports(name, path.name == "__init__.py", modules)
        visitor.visit(tree)
        graph[name] = visitor.found
        first_definition = next((node.lineno for node in tree.body
                                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))), None)
        late += [(name, line) for _, line, in_function in visitor.found
                 if not in_function and first_definition is not None and line > first_definition]
    return graph, late


GRAPH, LATE = _graph()
EDGES = {(module, imported) for module, found in GRAPH.items() for imported, _, _ in found if imported != module}


def test_the_graph_is_read():
    """The parse sees relative, absolute and package imports (so the rules below test something)."""
    for edge in [("flat.torch", "flat.torch.ops"), ("flat.torch.parallel", "flat.torch.ops"),
                 ("flat.jax.parallel", "flat.jax.ops"), ("flat.torch.ops", "flat._core"), ("flat", "flat._core"),
                 ("flat.nn.ops", "flat.torch"), ("flat.compat.mamba_ssm", "flat.torch"),
                 ("flat.bench.kernels", "flat.nn.ops"), ("flat.train.cli", "flat.train.loop"),
                 ("flat.train.sweep", "flat.train.loop")]:
        assert edge in EDGES, edge


def test_no_cycle():
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for imported in sorted({imported for m, imported in EDGES if m == module}):
            if state.get(imported) == "open":
                cycle = stack[stack.index(imported):] + [imported]
                pytest.fail("an import cycle: " + " -> ".join(cycle))
            if imported not in state:
                visit(imported)
        stack.pop()
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_no_late_import_of_flat():
    inside = [(module, line, imported) for module, found in GRAPH.items() for imported, line, in_function in found
              if in_function]
    assert not inside, f"flat's modules imported inside a function (module, line, imported): {inside}"
    assert not LATE, f"flat's modules imported after a function or class (module, line): {LATE}"


def test_bindings_below_the_front_ends():
    up = sorted((module, imported) for module, imported in EDGES if module in BINDINGS and imported not in BINDINGS)
    assert not up, f"a binding imports a module above it: {up}"


def test_benches_and_trainer_on_top():
    into = sorted((module, imported) for module, imported in EDGES for top in TOP
                  if _within(imported, top) and not _within(module, top))
    assert not into, f"the benches and the trainer are imported from below: {into}"


def test_public_names():
    """flat.torch.context_parallel is the function, as before the package (its module is parallel)."""
    assert callable(flat.torch.context_parallel) and flat.torch.context_parallel.__module__ == "flat.torch.parallel"
    assert flat.torch.gla.__module__ == "flat._api" and callable(flat.torch.accepted_state_indices)
    fj = pytest.importorskip("flat.jax")
    assert callable(fj.context_parallel) and fj.context_parallel.__module__ == "flat.jax.parallel"
