"""The glossary (ui/glossary.py): the terms a class meets are defined once; `annotate` marks a
term's first occurrence in prose and nowhere it would break the text (code, headings, links,
tags); the explainers come back marked; the tooltip is readable. No model, no browser (the
sanitizer finding behind the markup is in ui/glossary.py's docstring)."""

from __future__ import annotations

import html
import re

from ui.glossary import GLOSSARY_CSS, TERMS, annotate, definition, glossary_markdown, plain

TOKEN = html.escape(definition("token"))


def marked(text: str) -> list[str]:
    """The words `annotate` marked in `text`, in order."""
    return re.findall(r'<span class="dl-term" tabindex="0">([^<]*)<span class="dl-def"', text)


def test_the_terms_a_class_meets_are_defined_once():
    for word in ("forward", "draft", "verify", "bonus token", "KV cache", "acceptance length"):
        assert definition(word), word
    assert "non-autoregressive translation" in definition("NAT").lower()
    assert "mean_acceptance_length" in definition("acceptance length")
    # Spellings a text uses name their term (each spelling belongs to one term: _by_form raises).
    for word, term in [("forward passes", "forward"), ("drafted", "draft"), ("Drafts", "draft")]:
        assert definition(word) == definition(term), word
    assert len({t.definition for t in TERMS.values()}) == len(TERMS)  # no definition twice
    # Definitions are shown inside HTML blocks too, where markdown is not read, and in tables.
    assert not [n for n, t in TERMS.items() if re.search(r"[*`\[\]<>|]", t.definition)]


def test_annotate_marks_a_term_once_and_keeps_its_casing():
    text = annotate("Tokens come first. A token again, then a bonus token and the KV caches.")
    assert marked(text) == ["Tokens", "bonus token", "KV caches"]
    assert text.count(TOKEN) == 1


def test_annotate_leaves_code_headings_links_and_tags_alone():
    text = (
        "### The token\n"
        "A `token` in code, [a token link](https://x.org/token), "
        "<b title='a token'>bold</b>, <a href='#'>token</a>, "
        "<div class='dl-tour-where'>Stop 1 · One token per forward</div>\n"
        "```\ntoken = next(tokens)\n```\n"
        "y_<i) is no tag, and here is the token."
    )
    out = annotate(text)
    assert marked(out) == ["token"]  # the last word's, the only one in prose
    assert out.index('class="dl-term"') > out.index("y_<i)")
    assert plain(out) == text  # nothing else touched


def test_annotate_is_idempotent_and_escapes_the_definition():
    once = annotate("The target's draft.")
    assert annotate(once) == once
    assert "target&#x27;s" in annotate("The draft.")  # the draft's definition, escaped
    assert "target's" not in annotate("The draft.").split("dl-def")[1]


def test_an_explainer_comes_back_annotated():
    from ui.common import explainer

    text = explainer("speculative")
    assert "bonus" in marked(text) and text.startswith("### Speculative")
    assert "{{" not in text


def test_the_glossary_page_has_every_term_with_an_anchor():
    page = glossary_markdown()
    for name in TERMS:
        assert f"**{name}**" in page, name
    assert '<a id="glossary-kv-cache"></a>' in page


def test_the_tooltip_shows_on_hover_and_focus_inside_a_phone_screen_and_is_readable():
    css = GLOSSARY_CSS
    assert ".dl-term:hover > .dl-def" in css and ".dl-term:focus > .dl-def" in css
    assert "max-width: min(320px, 90vw)" in css and "dotted" in css

    def luminance(hex_colour: str) -> float:
        rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    bg = re.search(r"background: (#[0-9a-f]{6})", css).group(1)
    fg = re.search(r"[^-]color: (#[0-9a-f]{6})", css).group(1)
    light, dark = sorted((luminance(bg), luminance(fg)), reverse=True)
    assert (light + 0.05) / (dark + 0.05) >= 4.5
