"""The corpus's code (decoders/train/corpus.py): Python files of the standard library or of
installed packages, their documented functions cut after the docstring (prompts the target
continues) and raw source chunks."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import multiprocessing
import random
import sys
import sysconfig
from pathlib import Path

SKIP_DIRS = {"test", "tests", "testing", "idlelib", "site-packages", "lib2to3", "turtledemo"}


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts))


def source_files(sources: list[str]) -> tuple[list[Path], list[str]]:
    """The .py files of each source ('stdlib', or an installed package such as 'numpy'), and a
    label per source with its version, for the card."""
    files, labels = [], []
    for name in sources:
        if name == "stdlib":
            files += _python_files(Path(sysconfig.get_paths()["stdlib"]))
            labels.append(f"Python {sys.version.split()[0]} standard library")
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"error: --sources: no installed package {name!r}")
        files += _python_files(Path(next(iter(spec.submodule_search_locations))))
        # The import name can differ from the distribution's (sklearn is scikit-learn).
        dists = importlib.metadata.packages_distributions().get(name, [name])
        try:
            labels.append(f"{name} {importlib.metadata.version(dists[0])}")
        except importlib.metadata.PackageNotFoundError:
            labels.append(name)
    return files, labels


def function_prompts(files: list[Path]) -> list[str]:
    """Every documented top-level function, cut right after its docstring: signature + docstring,
    the shape of a code-completion prompt. Files are parsed in parallel, results kept in order."""
    if len(files) < 64:
        found = [_file_prompts(path) for path in files]
    else:
        with multiprocessing.get_context("fork").Pool() as pool:  # workers only parse text
            found = pool.map(_file_prompts, files, chunksize=16)
    # Once each: packages copy helpers between modules (transformers' "Copied from": 2951
    # prompts, 1831 distinct), which would weigh them many times over.
    return list(dict.fromkeys(p for prompts in found for p in prompts))


def _file_prompts(path: Path) -> list[str]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines, prompts = source.splitlines(), []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.body:
            continue
        doc = ast.get_docstring(node)
        if not doc or not 40 <= len(doc) <= 1200 or len(node.body) < 2:
            continue
        header = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno]) + "\n"
        if len(header) <= 2000:
            prompts.append(header)
    return prompts


def code_chunks(files: list[Path], n: int, chars: int, rng: random.Random) -> list[str]:
    """`n` random spans of raw source, each starting at a line boundary."""
    texts = [t for t in (p.read_text(encoding="utf-8", errors="replace") for p in files) if t]
    chunks: list[str] = []
    while len(chunks) < n and any(len(t) >= chars for t in texts):
        text = rng.choice(texts)
        if len(text) < chars:
            continue
        start = text.rfind("\n", 0, rng.randrange(len(text) - chars + 1)) + 1
        chunks.append(text[start : start + chars])
    return chunks
