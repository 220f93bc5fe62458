"""docs/METHODS.md is generated from the methods' declarations (`python -m decoders.docs`): it
must be what the code says."""

import warnings

from decoders import METHODS
from decoders.docs import PATH, documented, methods_markdown


def test_the_methods_page_is_what_the_declarations_generate():
    text = PATH.read_text()
    listed = documented(text)
    assert len(listed) >= 15, sorted(listed)
    # Every method the page lists, as its declaration now says: a changed default, help text,
    # preset or flag fails here until the page is generated again.
    assert text == methods_markdown(listed), "docs/METHODS.md is stale: python -m decoders.docs"
    missing = set(METHODS) - listed
    if missing:  # a method added since: listed once the page is generated again
        warnings.warn(
            f"docs/METHODS.md leaves out {sorted(missing)}: python -m decoders.docs", stacklevel=1
        )


def test_a_changed_default_makes_the_page_stale(monkeypatch):
    import dataclasses

    m = METHODS["prompt_lookup"]
    params = (dataclasses.replace(m.params[0], default=7), *m.params[1:])
    monkeypatch.setitem(METHODS, "prompt_lookup", dataclasses.replace(m, params=params))
    assert methods_markdown() != PATH.read_text()
