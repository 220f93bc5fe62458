"""Helpers for the browser tests (tests/test_browser*.py, tests/test_compare.py): one layout check
for every plotly figure in the page, and moving the Run tab to a step. Import them as
`from browser_helpers import ...` (pytest puts tests/ on the path, as for conftest)."""

from __future__ import annotations

# Measures every visible plotly figure under the element `root`, as drawn in the page; returns the
# number of figures checked and one line per problem.
LAYOUT_CHECK = r"""(root) => {
  // Every plotly figure under `root`: its text boxes (title, legend, annotations, axis titles, tick
  // labels, bar values) must stay inside the figure and must not overlap one another; titles,
  // legends and axis titles must not cover a plot area.
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
    if (cls.includes('bartext')) return 'bar text';  // a bar's value, e.g. Compare's "2.10×"
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


def layout_problems(page, selector: str = "body") -> list[str]:
    """LAYOUT_CHECK's problems for every figure under the first element matching `selector`."""
    return page.evaluate(LAYOUT_CHECK, page.locator(selector).first.element_handle())["problems"]


def settle(page) -> None:
    """Wait until every visible figure has drawn (plotly has its main svg) and the figures have
    stopped changing: the same drawing and sizes in two looks 250 ms apart (the extra panels
    follow the main one, and a resize redraws a moment later)."""
    page.wait_for_function(
        """() => Array.from(document.querySelectorAll('#panel, #timeline, #per-step, #hist'))
            .every(el => el.querySelector('.js-plotly-plot .main-svg'))""",
        timeout=60_000,
    )
    page.evaluate("window.__settled = null")
    page.wait_for_function(
        """() => {
            const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
            const sig = plots.map(p => {
                const r = p.getBoundingClientRect();
                return [Math.round(r.width), Math.round(r.height), p.innerHTML.length].join(':');
            }).join('|') + '#' + document.querySelectorAll('.main-svg').length;
            const same = window.__settled === sig;
            window.__settled = sig;
            return same;
        }""",
        polling=250,
        timeout=60_000,
    )


def go_to_step(page, step: int) -> None:
    # What the method panel and the timeline show now: a redraw at the new step changes them.
    drawn = """() => ['#panel', '#timeline'].map(id =>
        document.querySelector(id + ' .js-plotly-plot')?.innerHTML || '').join('|')"""
    before = page.evaluate(drawn)
    box = page.locator("#step input[type=number]")
    box.fill(str(step))
    box.press("Enter")
    page.wait_for_function(f"{STEP_NUMBER} === {step}", timeout=30_000)
    try:  # the panel's title names its step ("Step 5: ..."), or its drawing changed
        page.wait_for_function(
            """([s, before, drawn]) => {
                const t = document.querySelector('#panel .gtitle');
                const m = t && /\\bstep (\\d+)\\b/i.exec(t.textContent);
                return (m && +m[1] === s) || eval(drawn)() !== before; }""",
            arg=[step, before, drawn],
            timeout=30_000,
        )
    except Exception:  # nothing changed in the panel or the timeline: give it time to redraw
        page.wait_for_timeout(3000)
    settle(page)
