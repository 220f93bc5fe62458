"""What importing costs: the visualizer (pure functions over events) and the trace format load
without torch, while `from decoders import ...` still gives the whole engine; and which way the
engine's layers import."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "module",
    [
        "visualizer",
        "decoders",
        "decoders.core.events",
        "decoders.core.tree",
        "decoders.core.errors",
    ],
)
def test_imports_without_torch(module):
    done = python(
        f"import sys, {module}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "assert not loaded, loaded[:5]"
    )
    assert done.returncode == 0, done.stderr


def test_the_public_names_still_import():
    done = python(
        "import decoders\n"
        "from decoders import *\n"
        "from decoders import load_model, generate, METHODS, stream, ModelBundle\n"
        "missing = [n for n in decoders.__all__ if n not in globals()]\n"
        "assert not missing, missing\n"
        "assert 'token_tree' in METHODS and callable(generate)\n"
        "assert set(decoders.__all__) <= set(dir(decoders))\n"
        "try:\n"
        "    decoders.nosuch\n"
        "except AttributeError as e:\n"
        "    assert 'nosuch' in str(e)\n"
        "else:\n"
        "    raise SystemExit('decoders.nosuch did not raise')\n"
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("package", ["torch", "transformers"])
def test_the_installed_version_is_the_pinned_one(package):
    """The runtime relies on transformers' internals (and torch's kernels): the suite runs on the
    pinned minor versions, and a drift is named here before it shows as a wrong token."""
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.version import Version

    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pins = [Requirement(x) for x in lines if x.strip() and not x.startswith("#")]
    pin = next(r for r in pins if r.name == package)
    assert str(pin.specifier).startswith("=="), f"{package} is not pinned: {pin}"
    installed = Version(version(package)).base_version  # 2.13.0+cpu -> 2.13.0
    assert pin.specifier.contains(installed), f"{package} {installed} against the pin {pin}"


# Each layer of decoders/ and what it must never import: the methods sit on drafting, which sits
# on the trained parts and the core; nothing below a layer imports it, and no method another.
BELOW = {
    "methods": ("decoders.methods",),
    "drafting": ("decoders.methods",),
    "trained": ("decoders.methods", "decoders.drafting"),
    "core": ("decoders.methods", "decoders.drafting"),
}


def upward_imports(root: Path) -> list[str]:
    """Every import in root/decoders/<layer>/ of a module its layer must not import, read with
    `ast` (nothing is imported), relative imports resolved: 'path:line: module'."""
    found = []
    for layer, banned in BELOW.items():
        for path in sorted((root / "decoders" / layer).rglob("*.py")):
            package = list(path.relative_to(root).parts[:-1])  # what `from .` names
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:  # from . import x / from ..y import z
                        up = package[: len(package) - node.level + 1]
                        base = ".".join([*up, *([base] if base else [])])
                    names = [base, *(f"{base}.{a.name}" for a in node.names)]
                else:
                    continue
                hits = [n for n in names if any(n == b or n.startswith(b + ".") for b in banned)]
                if hits:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {hits[0]}")
    return found


def test_the_layers_import_downwards():
    assert not upward_imports(ROOT), upward_imports(ROOT)
