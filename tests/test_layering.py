"""The package's layers: data flows one way (file -> model -> GPU -> captures -> compare and viz), so
no module imports one of a layer above its own, and no modules import each other in a circle.

Every `import` counts, at module level or inside a function (a function-level import is the same
dependency, only later); imports under `if TYPE_CHECKING:` are annotations and do not. Importing a
package's own face (`from labkit.ops import OPS`) is importing that `__init__.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import labkit

ROOT = Path(labkit.__file__).parent

# bottom first: a module may import modules of its own layer and of the layers below
LAYERS = [
    ["labkit.errors", "labkit.poison", "labkit.progress", "labkit.quant"],
    ["labkit.sampling"],  # the sampler registry
    ["labkit.ops"],  # one package per op: reference, params, plan, kernels (calls neither engine)
    ["labkit.model"],  # the file, config, graph, tokenizer, the float64 reference
    ["labkit.precision", "labkit.selection", "labkit.chunks"],  # chunks: a pass in micro-batches, merged
    ["labkit.gpu"],  # the WebGPU engine
    ["labkit.memory_fit", "labkit.oracle"],
    ["labkit.runfile", "labkit.top_token"],  # a saved run's format; the top tokens of one row of logits
    ["labkit.lens", "labkit.logits_agreement"],  # the logit lens, over a run's captures
    ["labkit.captures", "labkit.sequence"],  # Run, Stats; a kept sequence
    ["labkit.lab", "labkit.compare", "labkit.generation", "labkit.batch"],  # batch: sequences packed in one pass
    [
        "labkit.attribution",
        "labkit.dumps",
        "labkit.lessons",
        "labkit.bench",
        "labkit.kernel_trial",
        "labkit.serving_paths",
    ],
    ["labkit.viz", "labkit.sweeps"],
    ["labkit.casebook"],
    ["labkit"],  # the public face (labkit/__init__.py)
    ["labkit.cli", "labkit.cli_args"],
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(name: str) -> set[str]:
    """The labkit modules `name` imports (`from pkg import sub` names the submodule, not the face)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
            continue
        base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
        module = ".".join([*base, *([node.module] if node.module else [])])
        subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
        out.update(subs)
        if len(subs) < len(node.names):
            out.add(module)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def layer_of(name: str) -> int:
    """The layer of the longest prefix of `name` that LAYERS lists."""
    best = None
    for i, units in enumerate(LAYERS):
        for unit in units:
            if (name == unit or name.startswith(unit + ".")) and (best is None or len(unit) > len(best[1])):
                best = (i, unit)
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[0]


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_no_import_reaches_a_layer_above():
    up = [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
          for a, bs in GRAPH.items() for b in sorted(bs) if layer_of(b) > layer_of(a)]  # fmt: skip
    assert not up, "imports that run back up:\n" + "\n".join(sorted(up))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_modules_import_each_other():
    found = circles(GRAPH)
    assert not found, "modules in a circle of imports:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_can_fail():
    """The rules find what they are meant to find, on a graph made up for the purpose."""
    made_up = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(made_up) == [["a", "b", "c"]]
    assert layer_of("labkit.ops.rope") < layer_of("labkit.gpu.executor") < layer_of("labkit.cli")
    assert "labkit.gpu.stage_host" in GRAPH["labkit.gpu.executor"]  # the reader sees real imports
    assert "labkit.bench.table" in GRAPH["labkit.bench.report"], "function-level imports are read"


def test_no_folder_holds_more_than_40_files():
    """A folder a newcomer can take in at a glance: an op's package, its faults, a shared library."""
    crowded = {}
    for folder in [ROOT, *(p for p in ROOT.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        n = sum(1 for f in folder.iterdir() if f.is_file() and not f.name.endswith(".pyc"))
        if n > 40:
            crowded[str(folder.relative_to(ROOT.parent))] = n
    assert not crowded, crowded


def test_every_kernel_file_is_found_by_its_name():
    """compose() names files by stem: the index holds each one once, at the path it lives at."""
    from labkit.ops.base import wgsl_file, wgsl_index

    files = sorted(ROOT.joinpath("ops").rglob("*.wgsl"))
    index = wgsl_index()
    assert len(index) == len(files) and len({f.stem for f in files}) == len(files)
    for f in files:
        assert index[f.stem] == str(f.relative_to(ROOT)) and wgsl_file(f.stem) == f.read_text()
