"""Every method's presets are complete, valid parameter sets."""

import pytest

from decoders import METHODS
from decoders.core.params import validate_params


@pytest.mark.parametrize("name", list(METHODS))
def test_presets_validate(name):
    m = METHODS[name]
    for preset in ["defaults", *m.presets]:
        values = m.preset(preset)
        assert set(values) == {p.name for p in m.knobs}  # a preset resets relaxed verification too
        validate_params(m.schema, values, name)  # raises on a bad value


def test_unknown_preset_is_named():
    with pytest.raises(KeyError, match="no preset 'nosuch'"):
        METHODS["lookahead"].preset("nosuch")


def test_paper_preset_differs_where_we_retuned():
    assert METHODS["lookahead"].preset("paper")["W"] == 15
    assert METHODS["lookahead"].preset("defaults")["W"] == 1


# --- the declarations everything derives from ------------------------------------------------------


def test_every_module_of_the_methods_package_declares_its_method():
    """One module per method: the registry is what the package holds, each module declaring the
    method of its own name, with an explainer beside it and views the visualizer has."""
    import pkgutil

    from decoders import methods
    from decoders.core.base import FAMILIES
    from ui.compare import parse_spec
    from visualizer.panels import MAX_EXTRA_PANELS, VIEWS

    modules = sorted(info.name for info in pkgutil.iter_modules(methods.__path__))
    assert modules == sorted(METHODS)
    for name, m in METHODS.items():
        assert m.decode.__module__ == f"decoders.methods.{name}"
        assert m.family in FAMILIES
        assert m.explainer_path.is_file(), m.explainer_path
        assert m.explainer().startswith("#"), name
        assert set(m.views) <= set(VIEWS) and len(m.views) - 1 <= MAX_EXTRA_PANELS, m.views
        for specs in m.compare.values():
            for spec in specs:
                parse_spec(spec)  # raises on a bad method, knob or value


def test_a_module_that_declares_no_method_is_named(monkeypatch, tmp_path):
    """A file dropped into the methods package without its declaration stops the registry with
    its name, not with a KeyError somewhere in the UI."""
    from decoders import methods, registry

    (tmp_path / "half_done.py").write_text("def decode(bundle, prompt_ids, cfg):\n    yield\n")
    monkeypatch.setattr(methods, "__path__", [*methods.__path__, str(tmp_path)])
    with pytest.raises(TypeError, match=r"half_done\.py declares no METHOD"):
        registry._discover()


def test_the_page_lists_methods_by_family():
    from decoders.core.base import FAMILIES

    order = [FAMILIES.index(m.family) for m in METHODS.values()]
    assert order == sorted(order) and next(iter(METHODS)) == "autoregressive"
