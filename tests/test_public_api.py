"""The public surface is pinned: `stratagem.__all__` changes only on purpose, and the library never
reaches into the server packages (imports point from the service towards `stratagem`)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import stratagem

ROOT = Path(__file__).resolve().parents[1]
SERVER_PACKAGES = {"optimizer_service", "simulator", "trial_runner", "models", "migrations"}

PUBLIC = {
    "CaptureError",
    "Client",
    "InfeasibleStrategyError",
    "InvalidDocumentError",
    "InvalidGraphError",
    "InvalidLayoutError",
    "InvalidResourceSpecError",
    "InvalidStrategyError",
    "Job",
    "Layout",
    "ModelGraph",
    "NotFoundError",
    "Prediction",
    "RequestRejectedError",
    "ResourceSpec",
    "ServiceError",
    "ServiceUnavailableError",
    "StratagemError",
    "Strategy",
    "TrialFailedError",
    "UnsupportedStrategyError",
    "__version__",
    "capture",
    "capture_hf_config",
    "distribute",
    "launch",
    "optimize",
    "predict",
    "trial",
}
LAZY_FACADES = {"stratagem/prediction.py": ["simulator"]}
"""The one documented exception (docs/layouts.md, "Architecture"): `stratagem.predict` imports the
simulator inside the function, never at module level."""


def test_all_is_pinned() -> None:
    assert set(stratagem.__all__) == PUBLIC


def test_every_public_name_resolves_to_the_thing_it_names() -> None:
    for name in stratagem.__all__:
        assert getattr(stratagem, name) is not None
    for name in ("capture", "capture_hf_config", "distribute", "launch", "optimize", "predict", "trial"):
        assert inspect.isfunction(getattr(stratagem, name)), name
    assert issubclass(stratagem.InvalidGraphError, stratagem.StratagemError)
    assert issubclass(stratagem.NotFoundError, stratagem.ServiceError)


@pytest.mark.slow
def test_importing_stratagem_does_not_load_torch_or_the_server() -> None:
    code = (
        "import sys, stratagem, stratagem.ir, stratagem.client\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(loaded & {'torch', 'optimizer_service', 'simulator', 'trial_runner', 'models', 'fastapi', 'sqlalchemy'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported at module level."""
    return _imports(ast.parse(path.read_text()).body)


def _all_imports(path: Path) -> set[str]:
    """Modules imported anywhere in the file, inside functions too."""
    return _imports(list(ast.walk(ast.parse(path.read_text()))))


def _imports(nodes: list[ast.AST] | list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_library_never_imports_the_server_packages_not_even_inside_functions() -> None:
    """The service plugs its CLI commands in through an entry point instead (see stratagem.cli); the
    one lazy facade imports the simulator inside `predict` only."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(_all_imports(path) & SERVER_PACKAGES)
        for path in (ROOT / "stratagem").rglob("*.py")
        if _all_imports(path) & SERVER_PACKAGES
    }
    assert offenders == LAZY_FACADES
    for path in LAZY_FACADES:
        assert not _top_level_imports(ROOT / path) & SERVER_PACKAGES, path


def test_subpackages_are_reached_by_attribute_without_importing_them_first() -> None:
    code = "import stratagem\nprint(type(stratagem.builders.PS()).__name__, callable(stratagem.zoo.gpt))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["PS", "True"]


def test_simulator_and_trial_runner_depend_only_on_stratagem() -> None:
    for package in ("simulator", "trial_runner"):
        for path in (ROOT / package).rglob("*.py"):
            bad = _top_level_imports(path) & (SERVER_PACKAGES - {package})
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
