"""Who may import whom (STYLE.md, Layout): read from the source, every import statement
counted, those inside functions too."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "pathways_nb"


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each module of the package → the package's modules it imports."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = _module(path)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "pathways_nb")
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    name = ".".join([*base, *([node.module] if node.module else [])])
                elif node.module and node.module.split(".")[0] == "pathways_nb":
                    name = node.module
                else:
                    continue
                found.add(name)
                # `from pathways_nb import client` imports a module too.
                found.update(f"{name}.{a.name}" for a in node.names if name == "pathways_nb")
        out[mod] = found
    return out


IMPORTS = _imports()


def _role(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _outside(mod: str) -> set[str]:
    """What ``mod`` imports from the package outside its own role's folder."""
    own = _role(mod)
    return {m for m in IMPORTS[mod] if _role(m) != own or m == "pathways_nb"}


def test_the_scan_sees_the_package() -> None:
    assert "pathways_nb.worker._executor" in IMPORTS
    assert "pathways_nb._core" in IMPORTS["pathways_nb.worker._executor"]
    assert "pathways_nb.client._session" in IMPORTS["pathways_nb.client"]


@pytest.mark.parametrize("mod", sorted(m for m in IMPORTS if _role(m) == "_core"))
def test_core_imports_nothing_else(mod: str) -> None:
    assert _outside(mod) == set()


@pytest.mark.parametrize("mod", sorted(m for m in IMPORTS if _role(m) == "wire"))
def test_wire_imports_only_the_core(mod: str) -> None:
    assert {_role(m) for m in _outside(mod)} <= {"_core"}


@pytest.mark.parametrize("mod", sorted(m for m in IMPORTS if _role(m) in ("controller", "worker")))
def test_controller_and_workers_never_import_the_client(mod: str) -> None:
    # Nor the Jupyter parts or the deployment that starts them.
    assert {_role(m) for m in _outside(mod)} <= {"_core", "wire"}


@pytest.mark.parametrize(
    "mod",
    sorted(m for m in IMPORTS if _role(m) in ("viz", "data", "lab") or m == "pathways_nb._magics"),
)
def test_jupyter_parts_and_data_pipelines_use_the_public_api(mod: str) -> None:
    public = {"pathways_nb", "pathways_nb.client", "pathways_nb.viz"}
    private = {m for m in _outside(mod) if m not in public and _role(m) != _role(mod)}
    assert private == set(), f"{mod} reaches past the public API: {sorted(private)}"


@pytest.mark.parametrize("mod", sorted(m for m in IMPORTS if _role(m) == "proxy"))
def test_the_proxy_is_a_client_of_the_cluster(mod: str) -> None:
    # It runs where a client runs: never the controller's or a host's code.
    assert {_role(m) for m in _outside(mod)} <= {"_core", "client", ""}, sorted(_outside(mod))
