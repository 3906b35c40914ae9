"""The import arrows between packages (docs/design.md, "Layout"), checked on every import statement,
including the ones inside functions. A new import across an arrow that is not allowed fails here.

    service  ->  sweeps.spec, sweeps.remote, sweeps.errors
    sweeps   ->  workloads.api                 (and sweeps.cli -> service.server: the composition root)
    workloads -> neither sweeps, service, ray.tune, optuna nor mlflow
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports_of(package: str) -> list[tuple[str, str]]:
    """``(module file relative to the repo, imported module)`` for every import in ``package``."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [(str(path.relative_to(ROOT)), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out += [(str(path.relative_to(ROOT)), node.module)]
                # ``from sweeps import remote`` imports sweeps.remote
                out += [(str(path.relative_to(ROOT)), f"{node.module}.{a.name}") for a in node.names
                        if node.module in ("sweeps", "workloads", "service")]
    return out


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_import_scan_sees_lazy_imports():
    found = imports_of("sweeps")
    assert ("sweeps/run/execute.py", "ray") in found or any(m == "ray" for f, m in found if f == "sweeps/run/execute.py")
    assert any(f == "sweeps/cli/main.py" and m.startswith("sweeps.run") for f, m in found)  # imported inside commands


def test_workloads_import_neither_the_sweep_nor_the_service_nor_tune():
    bad = [(f, m) for f, m in imports_of("workloads")
           if _under(m, ("sweeps", "service", "ray.tune", "optuna", "mlflow"))]
    assert not bad, f"workloads must not import these: {bad}"


def test_sweeps_reach_workloads_only_through_its_interface():
    bad = [(f, m) for f, m in imports_of("sweeps") if _under(m, ("workloads",)) and m != "workloads.api"
           and m != "workloads"]
    assert not bad, f"sweeps may import only workloads.api: {bad}"


def test_only_the_cli_imports_the_service():
    bad = [(f, m) for f, m in imports_of("sweeps") if _under(m, ("service",))
           and not (f.startswith("sweeps/cli/") and m == "service.server")]
    assert not bad, f"sweeps may not import the service (the CLI may import service.server): {bad}"


def test_the_service_imports_only_the_spec_the_remote_client_and_the_errors():
    allowed = ("sweeps.spec", "sweeps.remote", "sweeps.errors")
    bad = [(f, m) for f, m in imports_of("service") if _under(m, ("sweeps",)) and not _under(m, allowed)
           and m != "sweeps"]
    assert not bad, f"service may import only {allowed}: {bad}"
    assert not [(f, m) for f, m in imports_of("service") if _under(m, ("workloads",))]


@pytest.mark.parametrize("package, forbidden", [
    ("sweeps/spec", ("ray", "mlflow", "torch", "optuna", "workloads")),  # the service parses specs
    ("sweeps/analysis", ("ray", "mlflow", "torch", "optuna")),  # pure: cbs.json from trials.json anywhere
    ("sweeps/pruning/halving.py", ("ray",)),
    ("sweeps/pruning/rungs.py", ("ray",)),
])
def test_pure_modules_stay_pure(package, forbidden):
    paths = [ROOT / package] if package.endswith(".py") else sorted((ROOT / package).rglob("*.py"))
    bad = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            bad += [(path.name, n) for n in names if _under(n, forbidden)]
    assert not bad, f"{package} must not import {forbidden}: {bad}"


def test_every_third_party_package_the_product_imports_is_declared():
    """A package imported only because another one brings it breaks when that one stops bringing it:
    every top-level import of sweeps, workloads and service is the standard library, ours, or a
    distribution named in pyproject.toml's dependencies."""
    import importlib.metadata as md
    import re
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower().replace("_", "-")
                for r in project["dependencies"]}
    dists = md.packages_distributions()
    missing = set()
    for package in ("sweeps", "workloads", "service"):
        for path, module in imports_of(package):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in ("sweeps", "workloads", "service", "__future__"):
                continue
            names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
            if not names & declared:
                missing.add(f"{top} ({path})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
