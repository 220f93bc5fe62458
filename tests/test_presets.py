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
