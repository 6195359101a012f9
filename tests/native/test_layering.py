"""The package's layers point one way: no import circle, and each core layer imports only the
layers below it (function-level imports included, so a circle cannot hide inside a function)."""
import ast
from pathlib import Path

import infinitrain

ROOT = Path(infinitrain.__file__).parent

# bottom to top; a module may import its own layer (same package) and those listed before it
LAYERS = [
    ["infinitrain._native", "infinitrain.dtypes", "infinitrain.device", "infinitrain.io", "infinitrain._trace",
     "infinitrain.monitor",
     "infinitrain.hf", "infinitrain.hf_llama", "infinitrain.hf_peft", "infinitrain.size", "infinitrain.return_types",
     "infinitrain.multiprocessing"],
    ["infinitrain.runtime", "infinitrain.storage", "infinitrain.random", "infinitrain.amp", "infinitrain.cuda",
     "infinitrain.backends", "infinitrain.accelerator"],
    ["infinitrain.tensor"],
    ["infinitrain.kernels"],
    ["infinitrain.autograd"],
    ["infinitrain.ops"],
    ["infinitrain.tensor_methods", "infinitrain.creation", "infinitrain.functions", "infinitrain.dlpack",
     "infinitrain.execution", "infinitrain.linalg"],
    ["infinitrain.nn", "infinitrain.optim", "infinitrain.data", "infinitrain.checkpoint", "infinitrain.profiler",
     "infinitrain.precision_checker", "infinitrain.torch_files", "infinitrain.serialization",
     "infinitrain.distributed", "infinitrain.utils"],
    ["infinitrain.models", "infinitrain.deepspeed"],
    ["infinitrain.examples", "infinitrain.plan", "infinitrain.config", "infinitrain.plot", "infinitrain.lora",
     "infinitrain.cuda.amp",
     "infinitrain.generate", "infinitrain"],
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set:
    """Modules of the package that `path` imports anywhere in its body."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("infinitrain")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("infinitrain"):
                continue
            for a in node.names:  # `from . import x` names a submodule when one exists
                sub = f"{mod}.{a.name}"
                if (ROOT.parent / (sub.replace(".", "/") + ".py")).exists() or \
                        (ROOT.parent / sub.replace(".", "/") / "__init__.py").exists():
                    out.add(sub)
                else:
                    out.add(mod)
    out.discard(name)
    return out


def _graph() -> dict:
    return {_module_name(p): _imports(p) for p in ROOT.rglob("*.py")}


def _layer(mod: str) -> int:
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for n in names:
            if (mod == n or mod.startswith(n + ".")) and len(n) > best_len:
                best, best_len = i, len(n)
    assert best is not None, f"{mod} is in no layer; add it to LAYERS"
    return best


def test_no_import_circle():
    graph = _graph()
    state = {}

    def visit(m, path):
        if state.get(m) == 1:
            cycle = path[path.index(m):] + [m]
            raise AssertionError("import circle: " + " -> ".join(cycle))
        if state.get(m) == 2:
            return
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_layers_import_downwards():
    bad = []
    for m, deps in _graph().items():
        for d in deps:
            if _layer(d) > _layer(m):
                bad.append(f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})")
    assert not bad, "\n".join(sorted(bad))


def test_no_module_named_nn_below_the_nn_package():
    assert [p for p in ROOT.rglob("nn.py")] == []
