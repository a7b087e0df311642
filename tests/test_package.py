"""Importing rh3dgs is silent and never compiles; rendering on CPU never touches gsplat's CUDA JIT."""
import subprocess
import sys


def _run(code: str):
    return subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)


def test_import_is_silent_and_loads_nothing_heavy():
    code = (
        "import sys\n"
        "import rh3dgs\n"
        "heavy = [m for m in ('gsplat', 'open_clip', 'nerfstudio', 'rh3dgs._C', 'torch.utils.cpp_extension')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    p = _run(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr == ""


def test_cpu_render_never_loads_gsplat_cuda_backend():
    # Importing gsplat.cuda._backend starts gsplat's JIT build: the CPU path must never import it.
    code = (
        "import sys, torch\n"
        "import rh3dgs\n"
        "from rh3dgs.data.synthetic import SceneConfig, make_scene\n"
        "s = make_scene(SceneConfig(gaussians_per_unit_area=500, num_views=2, image_size=32))\n"
        "r = rh3dgs.render(s.gaussians, s.cameras, torch.ones(len(s.gaussians), 2))\n"
        "assert r.alpha.max() > 0.5\n"
        "assert 'gsplat.cuda._backend' not in sys.modules\n"
        # projection, SH and binning are rh3dgs' native CPU ops now: gsplat's CUDA side is not even imported
        "assert 'gsplat.cuda._wrapper' not in sys.modules\n"
    )
    p = _run(code)
    assert p.returncode == 0, p.stderr[-3000:]


def test_no_public_function_is_shadowed_by_a_submodule():
    """Importing any submodule (as `from rh3dgs.x import y` does) leaves rh3dgs.render / lift / load callable."""
    code = (
        "import importlib, pkgutil, rh3dgs\n"
        "skip = ('rh3dgs.nerfstudio', 'rh3dgs.viewer', 'rh3dgs.distributed')\n"
        "for m in pkgutil.walk_packages(rh3dgs.__path__, 'rh3dgs.'):\n"
        "    if not m.name.startswith(skip) and m.name != 'rh3dgs._C':\n"
        "        importlib.import_module(m.name)\n"
        "from rh3dgs.rendering import render as r1\n"
        "from rh3dgs.lifting import lift as l1\n"
        "names = [n for n in ('render', 'lift', 'load') if not callable(getattr(rh3dgs, n))]\n"
        "assert not names, names\n"
        "assert rh3dgs.render is r1 and rh3dgs.lift is l1\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


# ----------------------------------------------------------------------------------------- the layout
import ast  # noqa: E402
from pathlib import Path  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[1] / "rh3dgs"


def _modules():
    """{dotted name: (path, is_package)} of every module of rh3dgs."""
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return mods


def _imported(tree):
    """Import statements of a module, function-level ones included, ``if TYPE_CHECKING:`` blocks left out."""
    found = []

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node):
            test = node.test
            if getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node):
            found.append(node)

        def visit_ImportFrom(self, node):
            found.append(node)

    Visitor().visit(tree)
    return found


def _import_graph():
    """module -> the rh3dgs modules it imports (``from pkg import name`` counts pkg.name when it is a module)."""
    mods = _modules()
    graph = {}
    for m, (path, is_pkg) in mods.items():
        pkg = m.split(".") if is_pkg else m.split(".")[:-1]
        deps = set()
        for node in _imported(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
                continue
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            deps.update(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names)
        graph[m] = {d for d in deps if d in mods and d != m}
    return graph


def test_no_import_circle():
    """Strongly connected components of the import graph (Tarjan) are single modules."""
    graph, index, low, stack, circles = _import_graph(), {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_core_never_imports_the_nerfstudio_plugin():
    graph = _import_graph()
    bad = {m: sorted(d for d in deps if d.startswith("rh3dgs.nerfstudio"))
           for m, deps in graph.items() if not m.startswith("rh3dgs.nerfstudio")}
    assert not {m: d for m, d in bad.items() if d}


def test_one_room_per_concept_in_the_layout():
    """The lift is one package typed by its own config; one module is called memory."""
    memory = sorted(m for m in _modules() if "memory" in m.rpartition(".")[2])
    assert memory == ["rh3dgs.memory"], memory
    for path in (PACKAGE / "lifting").glob("*.py"):
        assert "cfg: Any" not in path.read_text(), path


MAX_FUNCTION_LINES = 120


def test_functions_read_as_their_algorithm():
    """No function of rh3dgs/ (docstring included) is over 120 lines: long ones are split into named steps."""
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                name = f"{path.relative_to(PACKAGE.parent).as_posix()}:{node.name}"
                if n > MAX_FUNCTION_LINES:
                    long[name] = n
    assert not long, long
