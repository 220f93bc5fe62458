"""METHODS: every decoding method by name, found in the methods package. A method registers by
being there: its module declares `METHOD = Method(...)` (decoders/core/base.py), and the CLI, the
UI and trace validation read this registry. Listed by family, then by each family's teaching order.

The module's file name is the method's name: a copy of a module under another file name (its
explainer beside it) is a method of its own, even before its declaration says so.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from decoders import methods
from decoders.core.base import FAMILIES, Method


def _discover() -> dict[str, Method]:
    found: list[Method] = []
    for info in pkgutil.iter_modules(methods.__path__):
        module = importlib.import_module(f"{methods.__name__}.{info.name}")
        method = getattr(module, "METHOD", None)
        if not isinstance(method, Method):
            raise TypeError(f"decoders/methods/{info.name}.py declares no METHOD = Method(...)")
        if method.name != info.name:  # the file names it
            method = dataclasses.replace(method, name=info.name)
        found.append(method)
    found.sort(key=lambda m: (FAMILIES.index(m.family), m.rank, m.name))
    titles: set[str] = set()
    for i, m in enumerate(found):  # a menu tells every method apart
        if m.title in titles:
            found[i] = m = dataclasses.replace(m, title=f"{m.title} [{m.name}]")
        titles.add(m.title)
    return {m.name: m for m in found}


METHODS: dict[str, Method] = _discover()
