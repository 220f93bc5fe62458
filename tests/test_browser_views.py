"""Every method's views in a real headless Chromium, on a desktop (1440 x 1000) and a phone
(390 x 844): after a run and at a middle step, no figure title, subtitle, legend entry, caption
(annotation), axis title or tick label may overflow its figure or overlap another text, and no title,
legend or axis title may cover a plot. The text boxes are measured in the page, as drawn.
Screenshots land in test-artifacts/ (views-<method>-<viewport>-<end|middle>.png)."""

from urllib.parse import quote

import pytest

from conftest import ARTIFACTS
from decoders import METHODS

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PROMPT = "def f(x):\n    return f(x) + f(x)\n"
TOKENS = 24
# Every method at its defaults, and lookahead with the paper's 2D window (N = 5, W = 15, G = 15).
RUNS = [(name, "") for name in METHODS] + [("lookahead", "&preset=paper")]

# Measures every visible plotly figure under `root` (see the module docstring); returns the number
# of figures checked and one line per problem.
LAYOUT_CHECK = r"""(root) => {
  // Every plotly figure under `root`: its text boxes (title, legend, annotations, axis titles, tick
  // labels) must stay inside the figure and must not overlap one another; titles, legends and axis
  // titles must not cover a plot area.
  const problems = [];
  const visible = (el) => {
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) return null;
    const cs = getComputedStyle(el);
    if (cs.display === 'none' || cs.visibility === 'hidden' || +cs.opacity === 0) return null;
    if (!el.textContent.trim()) return null;
    return r;
  };
  const kindOf = (el) => {
    const cls = el.getAttribute('class') || '';
    if (cls.includes('gtitle')) return 'title';
    if (/^[xy]\d*title$/.test(cls)) return 'axis title';
    if (cls.includes('legendtext')) return 'legend';
    if (cls.includes('annotation-text')) return 'annotation';
    const g = el.parentElement && (el.parentElement.getAttribute('class') || '');
    if (/^[xy]\d*tick$/.test(g)) return 'tick ' + g;
    return null;
  };
  const plots = root.querySelectorAll('.js-plotly-plot');
  plots.forEach((plot, p) => {
    const host = plot.closest('[id]');
    const name = (host && host.id ? '#' + host.id : 'plot ' + p);
    const box = plot.querySelector('.svg-container').getBoundingClientRect();
    const texts = [];
    plot.querySelectorAll('text').forEach((el) => {
      const kind = kindOf(el);
      if (!kind) return;
      const r = visible(el);
      if (!r) return;
      const m = /rotate\((-?[\d.]+)/.exec(el.getAttribute('transform') || '');
      const rotated = !!m && Math.abs(+m[1]) % 90 !== 0;  // slanted, not upright or vertical
      texts.push({kind, r, rotated, text: el.textContent.trim().slice(0, 40)});
    });
    const areas = [];
    plot.querySelectorAll('.bglayer rect.bg').forEach((el) => {
      const r = el.getBoundingClientRect();
      if (r.width > 1 && r.height > 1) areas.push(r);
    });
    const tol = 1;
    for (const t of texts) {
      const out = [];
      if (t.r.left < box.left - tol) out.push(`left by ${Math.round(box.left - t.r.left)}px`);
      if (t.r.right > box.right + tol) out.push(`right by ${Math.round(t.r.right - box.right)}px`);
      if (t.r.top < box.top - tol) out.push(`top by ${Math.round(box.top - t.r.top)}px`);
      if (t.r.bottom > box.bottom + tol) out.push(`bottom by ${Math.round(t.r.bottom - box.bottom)}px`);
      if (out.length) problems.push(`${name}: ${t.kind} '${t.text}' overflows the figure (${out.join(', ')})`);
    }
    const area = (r) => r.width * r.height;
    const shared = (a, b) =>
      Math.max(0, Math.min(a.right, b.right) - Math.max(a.left, b.left)) *
      Math.max(0, Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top));
    const overlap = (a, b, m = 1) =>
      Math.min(a.right, b.right) - Math.max(a.left, b.left) > m &&
      Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > m;
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        const a = texts[i], b = texts[j];
        // Slanted tick labels have axis-aligned boxes wider than their glyphs: neighbours on the
        // same axis are not compared.
        if (a.kind === b.kind && a.kind.startsWith('tick') && (a.rotated || b.rotated)) continue;
        // Where two axes meet, their first labels touch at the corner (Plotly's own placement):
        // labels of different axes count only when they cover a good part of each other.
        if (a.kind.startsWith('tick') && b.kind.startsWith('tick') && a.kind !== b.kind) {
          if (shared(a.r, b.r) > 0.5 * Math.min(area(a.r), area(b.r))) {
            problems.push(`${name}: ${a.kind} '${a.text}' overlaps ${b.kind} '${b.text}'`);
          }
          continue;
        }
        if (overlap(a.r, b.r)) problems.push(`${name}: ${a.kind} '${a.text}' overlaps ${b.kind} '${b.text}'`);
      }
      const t = texts[i];
      if (['title', 'legend', 'axis title'].includes(t.kind)) {
        for (const area of areas) {
          if (overlap(t.r, area, 2)) { problems.push(`${name}: ${t.kind} '${t.text}' covers a plot area`); break; }
        }
      }
    }
  });
  return {plots: plots.length, problems};
}"""

STEP_NUMBER = "+document.querySelector('#step input[type=number]').value"


def open_run(page, server: str, method: str, extra: str) -> None:
    """Open a link that pre-fills the form, run it, and wait for the run's last views."""
    page.goto(
        f"{server}?model=tiny-random&method={method}&max_new_tokens={TOKENS}"
        f"&prompt={quote(PROMPT)}{extra}"
    )
    page.locator("#run-btn").wait_for(timeout=60_000)
    page.wait_for_function(
        f"document.querySelector('#max-new-tokens input[type=number]')?.value === '{TOKENS}'",
        timeout=60_000,
    )
    page.locator("#run-btn").click()
    page.wait_for_function(
        "document.querySelector('#status')?.innerText.includes('Done')", timeout=180_000
    )
    # The finished run shows its last step: the slider's value is its maximum.
    page.wait_for_function(
        "(e => e && e.max !== '' && +e.max > 0 && +e.value === +e.max)"
        "(document.querySelector('#step input[type=range]'))",
        timeout=60_000,
    )
    settle(page)


def settle(page) -> None:
    """Wait until every visible figure has drawn (plotly has its main svg) and nothing is pending."""
    page.wait_for_function(
        """() => Array.from(document.querySelectorAll('#panel, #timeline, #per-step, #hist'))
            .every(el => el.querySelector('.js-plotly-plot .main-svg'))""",
        timeout=60_000,
    )
    page.wait_for_timeout(1200)  # the extra panels follow the main one


def go_to_step(page, step: int) -> None:
    box = page.locator("#step input[type=number]")
    box.fill(str(step))
    box.press("Enter")
    page.wait_for_function(f"{STEP_NUMBER} === {step}", timeout=30_000)
    # The method panel's title names its step ("Step 5: ..." or "... at step 5") once redrawn.
    try:
        page.wait_for_function(
            """s => { const t = document.querySelector('#panel .gtitle');
                      const m = t && /\\bstep (\\d+)\\b/i.exec(t.textContent);
                      return m && +m[1] === s; }""",
            arg=step,
            timeout=30_000,
        )
    except Exception:  # a panel whose title does not name the step: give it time to redraw
        page.wait_for_timeout(3000)
    settle(page)


def check_views(page, label: str) -> int:
    result = page.evaluate(LAYOUT_CHECK, page.locator("body").element_handle())
    page.screenshot(path=str(ARTIFACTS / f"views-{label}.png"), full_page=True)
    for panel in ("panel", "panel2", "panel3", "panel4", "panel5", "hist"):  # close-ups
        plot = page.locator(f"#{panel} .js-plotly-plot")
        if plot.count() and plot.first.is_visible():
            plot.first.screenshot(path=str(ARTIFACTS / f"views-{label}-{panel}.png"))
    assert not result["problems"], f"{label}:\n" + "\n".join(result["problems"])
    return result["plots"]


@pytest.mark.parametrize(
    ("method", "extra"), RUNS, ids=[m + e.replace("&preset=", "-") for m, e in RUNS]
)
@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_views_fit_after_the_run_and_at_a_middle_step(server, request, viewport, method, extra):
    page = request.getfixturevalue("page" if viewport == "desktop" else "phone_page")
    name = f"{method}{extra.replace('&preset=', '-')}-{viewport}"
    open_run(page, server, method, extra)
    plots = check_views(page, f"{name}-end")
    assert plots >= 4  # timeline, tokens per step, acceptance, the method's panel
    last = page.evaluate(STEP_NUMBER)
    middle = max(1, last // 2)
    go_to_step(page, middle)
    check_views(page, f"{name}-middle")
    if method == "lookahead":  # its extra views are shown too, each full width
        widths = page.evaluate(
            """() => Array.from(document.querySelectorAll('[id^=panel] .js-plotly-plot'))
                .filter(p => p.getBoundingClientRect().width > 0)
                .map(p => Math.round(p.getBoundingClientRect().width))"""
        )
        assert len(widths) >= 4 and max(widths) - min(widths) <= 2, widths


def test_layout_check_catches_clipping_and_overlaps(browser):
    """The check itself: a title wider than its figure and a caption pushed into the title strip
    are caught; a clean figure passes."""
    import plotly
    import plotly.graph_objects as go

    from visualizer.figures import _base_layout

    ok = _base_layout(go.Figure(go.Bar(x=[1, 2], y=[3, 4], name="bars")), "Fits")
    clipped = _base_layout(go.Figure(go.Bar(x=[1], y=[1])), "A title far too long " * 6)
    crowded = _base_layout(go.Figure(go.Bar(x=[1], y=[1])), "A title")
    crowded.add_annotation(  # a caption drawn over the title
        text="a caption", x=0, y=1.2, xref="paper", yref="paper", xanchor="left", yanchor="top"
    )
    page = browser.new_page(viewport={"width": 500, "height": 900})
    try:
        page.set_content(
            "".join(f'<div id="f{i}" style="width:360px"></div>' for i in range(3))
            + f"<script>{plotly.offline.get_plotlyjs()}</script>"
        )
        for i, fig in enumerate((ok, clipped, crowded)):
            page.evaluate(
                "([id, fig]) => Plotly.newPlot(id, fig.data, fig.layout)",
                [f"f{i}", fig.to_plotly_json()],
            )
        problems = page.evaluate(LAYOUT_CHECK, page.locator("body").element_handle())["problems"]
    finally:
        page.close()
    assert not [p for p in problems if p.startswith("#f0")], problems
    assert any(p.startswith("#f1: title") and "overflows the figure (right" in p for p in problems)
    assert any(p.startswith("#f2: annotation 'a caption'") for p in problems), problems
