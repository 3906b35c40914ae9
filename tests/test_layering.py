"""The import arrows between packages (docs/design.md, "Layout"), checked on every import statement,
including the ones inside functions. A new import across an arrow that is not allowed fails here.

    critbatch -> sweeps, workloads, service    (the CLI, the composition root: nothing imports it)
    service  ->  sweeps.spec, sweeps.remote, sweeps.errors, sweeps.settings (the CRITBATCH_* settings)
    sweeps   ->  workloads.api
                 (sweeps.spec, which the service parses with, may import workloads.api only: torch-free)
      within:  scaling -> run -> launch, store, search -> pruning, analysis; run -> tracking -> analysis -> spec
               (remote, the service's client, -> spec, files, errors, tracking.schema and .reader: never run)
    workloads -> neither sweeps, service, ray.tune, optuna nor mlflow
      within:  ray/ -> registry -> pretrain/, finetune/ -> train/, data/, model/ -> config, errors
               (train/ never imports data/ or model/: a workload hands the loop its model and batches)
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the product's top-level packages, the composition root (the CLI) first
PACKAGES = ("critbatch", "sweeps", "workloads", "service")


def imports_of(package: str) -> list[tuple[str, str]]:
    """``(module file relative to the repo, imported module)`` for every import in ``package`` (a folder, or
    one ``.py`` file)."""
    out = []
    paths = [ROOT / package] if package.endswith(".py") else sorted((ROOT / package).rglob("*.py"))
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [(str(path.relative_to(ROOT)), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out += [(str(path.relative_to(ROOT)), node.module)]
                # ``from sweeps import remote`` imports sweeps.remote
                out += [
                    (str(path.relative_to(ROOT)), f"{node.module}.{a.name}")
                    for a in node.names
                    if node.module in PACKAGES
                ]
    return out


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_import_scan_sees_lazy_imports():
    found = imports_of("sweeps")
    assert ("sweeps/run/execute.py", "ray") in found or any(
        m == "ray" for f, m in found if f == "sweeps/run/execute.py"
    )
    cli = imports_of("critbatch")
    assert any(f == "critbatch/main.py" and m.startswith("sweeps.run") for f, m in cli)  # imported inside commands
    assert ("critbatch/cluster.py", "service.server") in cli  # `critbatch serve`, inside its command


def test_workloads_import_neither_the_sweep_nor_the_service_nor_tune():
    bad = [
        (f, m) for f, m in imports_of("workloads") if _under(m, ("sweeps", "service", "ray.tune", "optuna", "mlflow"))
    ]
    assert not bad, f"workloads must not import these: {bad}"


def test_the_training_loop_never_imports_the_data_or_the_model():
    """``workloads/train/`` is handed its model and batches by a workload (``loop.Workload``): it imports
    neither ``workloads.data`` nor ``workloads.model``, not even inside a function."""
    found = imports_of("workloads/train")
    assert ("workloads/train/loop.py", "workloads.train.step") in found
    bad = [(f, m) for f, m in found if _under(m, ("workloads.data", "workloads.model"))]
    assert not bad, f"workloads/train must not import the data or the model: {bad}"


#: what each subpackage of ``workloads`` may import of ``workloads`` (its own modules always): the
#: layers of docs/design.md, "Layout".
WORKLOADS_LAYERS = {
    "workloads/train": ("workloads.config", "workloads.sections", "workloads.errors"),
    "workloads/data": ("workloads.errors",),
    "workloads/model": ("workloads.config", "workloads.sections", "workloads.errors"),
    "workloads/pretrain": (
        "workloads.config",
        "workloads.sections",
        "workloads.errors",
        "workloads.train",
        "workloads.data",
        "workloads.model",
    ),
    "workloads/finetune": (
        "workloads.config",
        "workloads.sections",
        "workloads.errors",
        "workloads.train",
        "workloads.data",
        "workloads.model",
    ),
    "workloads/ray": (
        "workloads.config",
        "workloads.sections",
        "workloads.errors",
        "workloads.train",
        "workloads.registry",
    ),
    "workloads/testing": ("workloads.config", "workloads.train.hooks"),
}


@pytest.mark.parametrize("package, allowed", WORKLOADS_LAYERS.items(), ids=list(WORKLOADS_LAYERS))
def test_each_workloads_subpackage_imports_only_the_layers_below_it(package, allowed):
    own = package.replace("/", ".")
    bad = [
        (f, m)
        for f, m in imports_of(package)
        if _under(m, ("workloads",)) and m != "workloads" and not _under(m, (own, *allowed))
    ]
    assert not bad, f"{package} may import only {allowed} of workloads: {bad}"


#: what each top-level module of ``workloads`` may import of ``workloads`` (``api.py`` re-exports everything: it is
#: not a layer); the bottom three import nothing of it
WORKLOADS_TOP = {
    "workloads/errors.py": (),
    "workloads/sections.py": (),
    "workloads/config.py": ("workloads.errors", "workloads.sections"),
    "workloads/registry.py": ("workloads.config", "workloads.pretrain", "workloads.finetune"),
}


@pytest.mark.parametrize("module, allowed", WORKLOADS_TOP.items(), ids=list(WORKLOADS_TOP))
def test_each_top_level_workloads_module_imports_only_what_is_below_it(module, allowed):
    bad = [
        (f, m)
        for f, m in imports_of(module)
        if _under(m, ("workloads",)) and m != "workloads" and not _under(m, allowed)
    ]
    assert not bad, f"{module} may import only {allowed} of workloads: {bad}"


def test_every_top_level_workloads_module_has_a_rule():
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "workloads").glob("*.py")}
    assert modules - {"workloads/__init__.py", "workloads/api.py"} == set(WORKLOADS_TOP)


#: what each part of ``sweeps`` may import of ``sweeps`` besides itself: the orchestration (``run``) sits above the
#: search, the pruning, the tracking and the analysis, which sit above the spec; the REST service's client
#: (``remote``) reaches none of the driver's packages, so the service never depends on them
_SWEEPS_BASE = ("sweeps.errors", "sweeps.files")
SWEEPS_LAYERS = {
    "errors": (),
    "files": ("sweeps.errors",),
    "settings": ("sweeps.errors",),
    "spec": ("sweeps.errors",),
    "_compat": _SWEEPS_BASE + ("sweeps.spec",),
    "analysis": _SWEEPS_BASE + ("sweeps.spec",),
    "tracking": _SWEEPS_BASE + ("sweeps.spec", "sweeps.analysis"),
    "pruning": _SWEEPS_BASE + ("sweeps.spec", "sweeps._compat"),
    "search": _SWEEPS_BASE + ("sweeps.spec", "sweeps._compat", "sweeps.analysis", "sweeps.pruning"),
    "remote": _SWEEPS_BASE + ("sweeps.spec", "sweeps._compat", "sweeps.tracking.schema", "sweeps.tracking.reader"),
    "launch": _SWEEPS_BASE
    + ("sweeps.spec", "sweeps._compat", "sweeps.pruning", "sweeps.settings", "sweeps.tracking.schema"),
    "store": _SWEEPS_BASE
    + (
        "sweeps.spec",
        "sweeps._compat",
        "sweeps.analysis",
        "sweeps.pruning",
        "sweeps.settings",
        "sweeps.search",
        "sweeps.tracking.schema",
    ),
    "run": _SWEEPS_BASE
    + (
        "sweeps.spec",
        "sweeps._compat",
        "sweeps.analysis",
        "sweeps.pruning",
        "sweeps.search",
        "sweeps.tracking",
        "sweeps.settings",
        "sweeps.launch",
        "sweeps.store",
    ),
    "scaling": _SWEEPS_BASE + ("sweeps.spec", "sweeps.analysis", "sweeps.tracking", "sweeps.run"),
}


@pytest.mark.parametrize("part, allowed", SWEEPS_LAYERS.items(), ids=list(SWEEPS_LAYERS))
def test_each_part_of_sweeps_imports_only_the_parts_below_it(part, allowed):
    path = f"sweeps/{part}" if (ROOT / "sweeps" / part).is_dir() else f"sweeps/{part}.py"
    own = f"sweeps.{part}"
    bad = [
        (f, m)
        for f, m in imports_of(path)
        if _under(m, ("sweeps",)) and m != "sweeps" and not _under(m, (own,) + allowed)
    ]
    assert not bad, f"{path} may import only {allowed} of sweeps: {bad}"


def test_every_part_of_sweeps_has_a_rule():
    parts = {
        p.name if p.is_dir() else p.stem
        for p in (ROOT / "sweeps").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert parts - {"examples"} == set(SWEEPS_LAYERS)


def test_no_relative_imports():
    """The scans above read absolute imports only; a relative one would pass them unseen."""
    relative = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative += [
                f"{path.relative_to(ROOT)}:{n.lineno}"
                for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(n, ast.ImportFrom) and n.level > 0
            ]
    assert not relative, relative


def test_every_workloads_module_is_in_a_layer():
    """A new subpackage of ``workloads`` gets its row in ``WORKLOADS_LAYERS``."""
    subpackages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "workloads").glob("*/__init__.py")}
    assert subpackages == set(WORKLOADS_LAYERS)


def test_sweeps_reach_workloads_only_through_its_interface():
    bad = [
        (f, m)
        for f, m in imports_of("sweeps")
        if _under(m, ("workloads",)) and m != "workloads.api" and m != "workloads"
    ]
    assert not bad, f"sweeps may import only workloads.api: {bad}"


def test_sweeps_import_no_service():
    bad = [(f, m) for f, m in imports_of("sweeps") if _under(m, ("service",))]
    assert not bad, f"sweeps may not import the service (the CLI, critbatch/, wires them together): {bad}"


@pytest.mark.parametrize("package", ["sweeps", "workloads", "service"])
def test_nothing_below_the_cli_imports_it(package):
    """The CLI (``critbatch/``) is the composition root: it may import sweeps, workloads and service, and
    none of them imports it back."""
    bad = [(f, m) for f, m in imports_of(package) if _under(m, ("critbatch",))]
    assert not bad, f"{package} must not import the CLI (critbatch): {bad}"


def test_the_service_imports_only_the_spec_the_remote_client_and_the_errors():
    allowed = ("sweeps.spec", "sweeps.remote", "sweeps.errors", "sweeps.settings")
    bad = [
        (f, m) for f, m in imports_of("service") if _under(m, ("sweeps",)) and not _under(m, allowed) and m != "sweeps"
    ]
    assert not bad, f"service may import only {allowed}: {bad}"
    assert not [(f, m) for f, m in imports_of("service") if _under(m, ("workloads",))]


@pytest.mark.parametrize(
    "package, forbidden, allowed",
    [
        # the service parses specs: of workloads only its torch-free interface (the error base, the config types)
        ("sweeps/spec", ("ray", "mlflow", "torch", "optuna", "workloads"), ("workloads.api",)),
        ("sweeps/analysis", ("ray", "mlflow", "torch", "optuna"), ()),  # pure: cbs.json from trials.json anywhere
        ("sweeps/pruning/halving.py", ("ray",), ()),
        ("sweeps/pruning/rungs.py", ("ray",), ()),
    ],
)
def test_pure_modules_stay_pure(package, forbidden, allowed):
    paths = [ROOT / package] if package.endswith(".py") else sorted((ROOT / package).rglob("*.py"))
    bad = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            )
            bad += [(path.name, n) for n in names if _under(n, forbidden) and n not in allowed]
    assert not bad, f"{package} must not import {forbidden} (but {allowed}): {bad}"


def test_one_error_base_for_every_layer():
    """Every exception class of the product derives from the one base at the lowest layer
    (``workloads.errors.CritbatchError``, re-exported by ``workloads.api`` and ``sweeps.errors``): a class
    whose bases include a built-in exception has a base of ours beside it (``InvalidInput, ValueError``),
    CritbatchError itself aside."""
    import builtins

    import sweeps.errors
    import workloads.api
    from workloads.errors import CritbatchError

    assert sweeps.errors.CritbatchError is workloads.api.CritbatchError is CritbatchError
    assert sweeps.errors.InvalidInput is workloads.api.InvalidInput
    builtin_errors = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    bare = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ClassDef) or node.name == "CritbatchError":
                    continue
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                if bases and all(b in builtin_errors for b in bases):
                    bare.append(f"{path.relative_to(ROOT)}:{node.name}({', '.join(bases)})")
    assert not bare, f"derive these from sweeps.errors / workloads.errors (CritbatchError, InvalidInput): {bare}"


def test_the_spec_imports_from_workloads_only_its_torch_free_interface():
    """The spec embeds the trial config's sections, through ``workloads.api`` only: importing it
    stays free of torch (tests/service/test_service_imports.py)."""
    bad = [(f, m) for f, m in imports_of("sweeps/spec") if _under(m, ("workloads",)) and m != "workloads.api"]
    assert not bad, f"sweeps/spec may import only workloads.api from workloads: {bad}"


def test_every_third_party_package_the_product_imports_is_declared():
    """A package imported only because another one brings it breaks when that one stops bringing it:
    every top-level import of critbatch, sweeps, workloads and service is the standard library, ours, or a
    distribution named in pyproject.toml's dependencies or in an extra of a role (not ``test``)."""
    import importlib.metadata as md
    import re
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    roles = [r for extra, reqs in project["optional-dependencies"].items() if extra != "test" for r in reqs]
    declared = {
        re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in (*project["dependencies"], *roles)
    }
    dists = md.packages_distributions()
    missing = set()
    for package in PACKAGES:
        for path, module in imports_of(package):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in (*PACKAGES, "__future__"):
                continue
            names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
            if not names & declared:
                missing.add(f"{top} ({path})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


def _module_file(module: str) -> str | None:
    """The file of ``module`` in this repository (``a/b.py`` or ``a/b/__init__.py``), or None."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return str(path.relative_to(ROOT))
    return None


def import_graph() -> dict[str, set[str]]:
    """``file -> files it imports`` within critbatch, sweeps, workloads and service: every import statement,
    lazy and ``TYPE_CHECKING`` ones included; ``from P import m`` of a module ``m`` is an arrow to ``P/m.py``.
    A package's ``__init__.py`` is no node: it only hands its modules' names on."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            here = str(path.relative_to(ROOT))
            if path.name == "__init__.py":
                continue
            targets: set[str | None] = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    targets |= {_module_file(a.name) for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for a in node.names:
                        targets.add(_module_file(f"{node.module}.{a.name}") or _module_file(node.module))
            graph[here] = {t for t in targets if t and t != here and not t.endswith("__init__.py")}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm): files that import
    each other, directly or through others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_circle_finder_finds_a_circle_through_three_files():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    """No import circles: a circle makes a module's place in the layers undefined, and each
    one is dodged today only by importing inside a function."""
    graph = import_graph()
    assert graph["sweeps/run/api.py"] >= {"sweeps/run/compare.py", "sweeps/run/driver.py"}  # lazy imports are seen
    assert import_circles(graph) == []


def continuation_lines(source: str) -> set[int]:
    """The line numbers that continue a statement begun on an earlier line (inside open brackets), not in a
    multi-line string: where a statement's arguments wrap is the formatter's choice (``ruff format``), not the
    code's size."""
    depth, cont, strings = 0, set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type in (tokenize.NL, tokenize.NEWLINE) and depth > 0:
            cont.add(tok.start[0] + 1)
        elif tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            strings.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return cont - strings


def test_a_wrapped_call_counts_once_and_a_docstring_line_by_line():
    source = 'def f(\n    a,\n    b,\n):\n    """One.\n\n    Two.\n    """\n    return g(\n        a, b\n    )\n'
    assert continuation_lines(source) == {2, 3, 4, 10, 11}


def test_no_module_over_450_lines_and_no_function_over_80():
    """The size rule, on every module of the four packages: its lines, and a function's (docstring included),
    less the lines that only continue a wrapped statement (:func:`continuation_lines`), so that the formatter's
    wrapping neither grows nor shrinks a module."""
    long_modules, long_functions = [], []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            where = str(path.relative_to(ROOT))
            cont = continuation_lines(source)
            n = len(source.splitlines()) - len(cont)
            if n > 450:
                long_modules.append(f"{where} ({n})")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
                    size = len(span) - len(cont.intersection(span))
                    if size > 80:
                        long_functions.append(f"{where}::{node.name} ({size})")
    assert not long_modules and not long_functions, (long_modules, long_functions)
