"""The package's shape, read from its source: layers that only look down, no circle, no private imports.

``d2lmini`` is layered (the README's table "Layout" says so, and a test below holds it to this file): at the
bottom the model parts, importing only each other and the helpers beside them; above them the real models' layers
(``d2lmini.reference``, one module per family); above those the experiments, explorers and
chapter modules. Every module is parsed with :mod:`ast` (nothing is imported, so the test is
quick and sees imports inside functions too) and its imports of other ``d2lmini`` modules become
the edges of a graph, on which the tests below check the rules.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "d2lmini"

#: The model parts: they may import only each other (the helpers beside them included: the argument checks,
#: the printed-code marker, the parameter counts, seeded randomness).
MODEL_PARTS = {f"d2lmini.{name}" for name in (
    "_checks", "_shown", "attention", "block", "cache", "deepseek_v4", "deltanet", "ffn", "hyper", "lm", "mla",
    "moe", "norms", "parameters", "placements", "seeding")}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if module in PACKAGES else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str):
    """Yield ``(target module, imported name or None, bound name, line)`` for each d2lmini import in ``module``."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "d2lmini":
                    bound = alias.asname or alias.name.split(".")[0]
                    yield alias.name, None, bound, node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if source.split(".")[0] != "d2lmini":
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:  # ``from d2lmini import zoo``: the module itself
                    yield submodule, None, alias.asname or alias.name, node.lineno
                else:
                    yield source, alias.name, alias.asname or alias.name, node.lineno


def _graph() -> dict[str, set[str]]:
    return {module: {target for target, *_ in _imports(module) if target in MODULES and target != module}
            for module in MODULES}


GRAPH = _graph()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_every_module_and_the_known_edges():
    assert "d2lmini.norms" in GRAPH and "d2lmini.reference" in GRAPH
    assert "d2lmini.norms" in GRAPH["d2lmini.attention"]  # attention builds its QK-norms from norms
    assert any(name.startswith("d2lmini.reference") for name in GRAPH["d2lmini.chapters.zoo"])


def test_the_import_graph_has_no_cycle():
    assert _cycles(GRAPH) == []


def test_model_parts_import_only_model_parts():
    assert MODEL_PARTS <= set(MODULES), sorted(MODEL_PARTS - set(MODULES))
    upward = sorted(f"{module} -> {target}" for module in MODEL_PARTS for target in GRAPH[module]
                    if target not in MODEL_PARTS)
    assert upward == [], "a model part imports a module above it"


def test_the_readme_names_the_same_model_parts():
    # The README's layout table lists the package's top-level modules: the model parts (and the helpers beside
    # them) before "the shared machinery above them", the rest after. Fails if the table and MODEL_PARTS part ways.
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `d2lmini/` |"))
    below, above = row.split("the shared machinery above them")
    named = lambda text: {f"d2lmini.{name}" for name in re.findall(r"`(\w+)\.py`", text)}
    top_level = {name for name, path in MODULES.items() if path.parent == PACKAGE and path.name != "__init__.py"}
    assert named(below) == MODEL_PARTS
    assert named(above) == top_level - MODEL_PARTS


def test_reference_imports_model_parts_and_itself_only():
    reference = {name for name in MODULES if name == "d2lmini.reference" or name.startswith("d2lmini.reference.")}
    assert len(reference) > 5, "the real models' layers live in a package, one module per family"
    upward = sorted(f"{module} -> {target}" for module in reference for target in GRAPH[module]
                    if target not in MODEL_PARTS | reference)
    assert upward == [], "a module of d2lmini.reference imports a chapter, explorer or experiment module"


def _private(name: str | None) -> bool:
    return name is not None and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(module: str) -> list[str]:
    """``from X import _name`` of another d2lmini module, and ``X._name`` on a name bound by such an import."""
    found, bound = [], {}
    for target, name, alias, line in _imports(module):
        if target != module and _private(name):
            found.append(f"{module}:{line} imports {target}.{name}")
        bound[alias] = target
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and bound[node.value.id] != module and _private(node.attr)):
            found.append(f"{module}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_name():
    found = [use for module in sorted(MODULES) for use in _private_uses(module)]
    assert found == []


#: The import statements whose cost :func:`test_imports_load_no_chapter_module_and_no_transformers` checks.
STATEMENTS = ["import d2lmini", "import d2lmini.norms", "from d2lmini import TransformerBlock", "import d2lmini.reference"]


@pytest.fixture(scope="module")
def loaded_after() -> dict[str, list[str]]:
    """``statement -> the modules a fresh interpreter holds after it``, for each of :data:`STATEMENTS`.

    One interpreter imports torch (every statement imports it first: d2lmini's ``__init__`` does), then
    forks a child per statement that runs it and reports ``sys.modules``: torch is imported once, not
    once per statement, and each child starts with nothing of d2lmini, matplotlib or transformers.
    """
    code = ("import json, os, sys\nimport torch\nout = {}\n"
            "for statement in json.loads(sys.argv[1]):\n"
            "    read, write = os.pipe()\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        os.close(read)\n"
            "        try:\n"
            "            exec(statement, {})\n"
            "        except BaseException:\n"
            "            os._exit(1)\n"
            "        with os.fdopen(write, 'w') as f:\n"
            "            f.write('\\n'.join(sorted(sys.modules)))\n"
            "        os._exit(0)\n"
            "    os.close(write)\n"
            "    with os.fdopen(read) as f:\n"
            "        out[statement] = f.read().split()\n"
            "    if os.waitpid(pid, 0)[1] != 0:\n"
            "        raise SystemExit(f'{statement!r} failed')\n"
            "print(json.dumps(out))\n")
    result = subprocess.run([sys.executable, "-c", code, json.dumps(STATEMENTS)], capture_output=True, text=True,
                            check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                                                       "PATH": "/usr/bin:/bin", "HOME": str(pathlib.Path.home())})
    return json.loads(result.stdout)


@pytest.mark.parametrize("statement", STATEMENTS)
def test_imports_load_no_chapter_module_and_no_transformers(statement, loaded_after):
    loaded = loaded_after[statement]
    assert "d2lmini" in loaded
    heavy = [name for name in loaded if name.startswith("d2lmini.chapters") or name.split(".")[0] == "transformers"]
    assert heavy == []
    if statement != "import d2lmini.reference":  # the model parts draw nothing: no matplotlib, no widgets
        assert [name for name in loaded if name.split(".")[0] in ("matplotlib", "ipywidgets")] == []


def test_chapter_modules_and_their_names_load_on_first_use():
    code = ("import sys, d2lmini\n"
            "assert 'd2lmini.chapters' not in sys.modules\n"
            "from d2lmini.chapters import ch04_norm_placement\n"
            "assert d2lmini.ch04_norm_placement is ch04_norm_placement\n"
            "assert d2lmini.chapters.ch04_norm_placement is ch04_norm_placement\n"
            "assert d2lmini.chapters.ch07_ffn.__name__ == 'd2lmini.chapters.ch07_ffn'\n"
            "assert d2lmini.depth_explorer is ch04_norm_placement.depth_explorer\n"
            "assert d2lmini.qk_scale_explorer.__module__ == 'd2lmini.chapters.ch06_qk_norm'\n"
            "assert d2lmini.errors.__name__ == 'd2lmini.chapters.errors'\n"
            "assert d2lmini.train.train_step and d2lmini.reference.from_hf\n"
            "assert d2lmini.StaticTwin is d2lmini.widgets.StaticTwin\n"
            "assert d2lmini.exercises.check\n"
            "assert set(d2lmini.__all__) <= set(dir(d2lmini))\n"
            "try:\n    d2lmini.no_such_name\nexcept AttributeError as e:\n    assert 'no_such_name' in str(e)\n"
            "else:\n    raise SystemExit('no AttributeError')\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_one_registry_filled_by_one_decorator_with_one_signature():
    import inspect

    from d2lmini import reference
    from d2lmini.reference.base import HF_CONVERTERS, converter

    for module in (name for name in MODULES if name.startswith("d2lmini.reference") and name != "d2lmini.reference.base"):
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if isinstance(node, (ast.Assign, ast.AugAssign)):  # only base's decorator writes HF_CONVERTERS[...]
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assert not any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "HF_CONVERTERS"
                               for t in targets), f"{module}:{node.lineno}"
    assert reference.HF_CONVERTERS is HF_CONVERTERS and len(HF_CONVERTERS) == 31
    for name, function in HF_CONVERTERS.items():
        parameters = list(inspect.signature(function).parameters.values())
        assert [p.name for p in parameters] == ["layer", "config", "layer_idx"], name
        assert parameters[2].default is None, name
        assert function.__name__.startswith("from_") and getattr(reference, function.__name__) is function
    with pytest.raises(ValueError, match="LlamaDecoderLayer already has a converter, from_llama_layer"):
        converter("LlamaDecoderLayer")(lambda layer, config, layer_idx=None: None)
    with pytest.raises(ValueError, match="at least one"):
        converter()
    with pytest.raises(TypeError, match="must be strings"):
        converter(3)
    assert "LlamaDecoderLayer" in HF_CONVERTERS and HF_CONVERTERS["LlamaDecoderLayer"] is reference.from_llama_layer


def test_one_chapter_module_per_notebook_and_each_notebook_imports_its_own():
    """``d2lmini/chapters/chNN_x.py`` serves ``chapters/NN_x.ipynb`` (``errors.py``, ``zoo.py``: the page of that
    name), and a page imports no other page's module: what two pages share lives below the chapter modules."""
    import re

    import nbformat

    def page(module: str) -> str:
        name = module.rsplit(".", 1)[1]
        return re.sub(r"^ch(\d\d)_", r"\1_", name) + ".ipynb"

    chapter_modules = {name for name in MODULES if name.startswith("d2lmini.chapters.")}
    assert "d2lmini.chapters.zoo" in chapter_modules
    assert [m for m in sorted(chapter_modules) if not (ROOT / "chapters" / page(m)).exists()] == []
    for notebook in sorted((ROOT / "chapters").glob("*.ipynb")):
        code = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
        imported = set(re.findall(r"d2lmini\.chapters(?: import |\.)(\w+)", code))
        assert {page(f"d2lmini.chapters.{name}") for name in imported} <= {notebook.name}, notebook.name
