"""Shared links: the page's URL parameters checked, one message per bad value, each naming its
parameter; and the page's budget rule, shared by the form, links and the API. No gradio here."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decoders import METHODS, InvalidInput
from decoders.core.errors import DecodingLabError
from decoders.core.params import SAMPLING_PARAMS, Param
from decoders.engine import MAX_PROMPT_CHARS

from .models import check_draft, resolve_model

UI_MAX_NEW_TOKENS = int(os.environ.get("DECODING_LAB_UI_MAX_NEW_TOKENS", "512"))


def check_budget(max_new_tokens: Any, shown: Any = None) -> int:
    """This page's budget rule, one message for the form, links and the API: a whole number in
    1..UI_MAX_NEW_TOKENS (the engine's own cap, MAX_NEW_TOKENS_CAP, is larger)."""
    value = max_new_tokens
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= UI_MAX_NEW_TOKENS:
        raise InvalidInput(
            f"max_new_tokens must be a whole number between 1 and {UI_MAX_NEW_TOKENS} on this page, "
            f"got {max_new_tokens if shown is None else shown!r}"
        )
    return value


# The form's own fields a link may set; any method parameter may follow (`?method=jacobi&block=8`),
# or come as one JSON object (`?params={"block": 8}`), or from a named preset (`?preset=paper`).
LINK_FORM_FIELDS = ("model", "prompt", "method", "max_new_tokens", "preset", "params", "step")
# A tour link's own fields (`?tour=5&step=2&lesson=1&present=1`: ui/tour_show.read_link); no
# method's parameter may take one of these names, nor a form field's (tests/test_links.py).
TOUR_LINK_FIELDS = ("tour", "step", "lesson", "present")
SAMPLING_BY_NAME = {p.name: p for p in SAMPLING_PARAMS}


@dataclass
class Link:
    """What a shared link asks for, checked: the form's fields (model, prompt, method,
    max_new_tokens, temperature, top_p, seed), the chosen method's parameters, and one message
    per bad value, each naming its parameter. Bad values are left out, so the form keeps its own."""

    fields: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def parse_param(p: Param, raw: Any) -> Any:
    """A link's (or a file's) value for one parameter, or InvalidInput naming it. Numbers must be
    finite and within the schema's range; the range in the message is the schema's."""
    if p.type in (int, float) and not isinstance(raw, bool):
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise InvalidInput(f"{p.name} must be a number, got {raw!r}") from None
        if not math.isfinite(number):
            raise InvalidInput(f"{p.name} must be a finite number, got {raw!r}")
        if p.type is int and not number.is_integer():
            raise InvalidInput(f"{p.name} must be a whole number, got {raw!r}")
        if (p.min is not None and number < p.min) or (p.max is not None and number > p.max):
            lo, hi = (_plain(v) for v in (p.min, p.max))
            raise InvalidInput(f"{p.name} must be between {lo} and {hi}, got {raw}")
        raw = int(number) if p.type is int else number
    try:
        return p.parse(raw)
    except DecodingLabError as exc:
        raise InvalidInput(str(exc).replace("parameter ", "", 1)) from None


def _plain(v: float | None) -> str:
    return "—" if v is None else (str(int(v)) if float(v).is_integer() else str(v))


def parse_link(query: Mapping[str, str], default_method: str) -> Link:
    """Check a page link's query parameters; collect a message for every bad one."""
    link = Link()
    q = {k: v for k, v in query.items() if not k.startswith("__") and k != "view"}  # gradio's own

    def attempt(fn: Any) -> Any:
        try:
            return fn()
        except (DecodingLabError, KeyError, ValueError) as exc:
            link.errors.append(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
            return None

    method = default_method
    if "method" in q:
        if q["method"] in METHODS:
            method = link.fields["method"] = q["method"]
        else:
            link.errors.append(
                f"method={q['method']!r} is not a method here; valid: {', '.join(METHODS)}"
            )
    m = METHODS[method]
    if "model" in q:
        model = attempt(lambda: resolve_model(q["model"]))
        if model is not None:
            link.fields["model"] = model
    if "prompt" in q:
        if len(q["prompt"]) > MAX_PROMPT_CHARS:
            link.errors.append(
                f"prompt has {len(q['prompt'])} characters; the limit is {MAX_PROMPT_CHARS}"
            )
        else:
            link.fields["prompt"] = q["prompt"]
    if "step" in q and "tour" not in q:  # the Run tab's: its next run opens at that step
        raw = q["step"]
        if raw.isdigit():
            link.fields["step"] = int(raw)
        else:
            link.errors.append(f"step must be a whole number (0 = the prompt's step), got {raw!r}")
    if "max_new_tokens" in q:
        budget = attempt(lambda: _link_budget(q["max_new_tokens"]))
        if budget is not None:
            link.fields["max_new_tokens"] = budget
    for name, p in SAMPLING_BY_NAME.items():
        if name in q:
            value = attempt(lambda p=p, raw=q[name]: parse_param(p, raw))
            if value is not None:
                link.fields[name] = value

    given: dict[str, Any] = {}
    if "preset" in q:
        preset = q["preset"]
        if preset == "defaults" or preset in m.presets:
            given |= m.preset(preset)
            link.fields["preset"] = preset
        else:
            known = ", ".join(["defaults", *m.presets])
            link.errors.append(f"preset={preset!r} is not a preset of {method}; known: {known}")
    if "params" in q:
        given |= attempt(lambda: _link_params(q["params"], m)) or {}
    by_name = {p.name: p for p in m.knobs}
    others: dict[str, list[str]] = {}  # a parameter name -> every other method that has it
    for n, other in METHODS.items():
        for p in other.knobs:
            if n != method:
                others.setdefault(p.name, []).append(n)
    for key, raw in q.items():
        if key in LINK_FORM_FIELDS or key in SAMPLING_BY_NAME or key in TOUR_LINK_FIELDS:
            continue
        if key in by_name:
            given[key] = raw
        elif key in others:
            owners = others[key]
            hint = (
                f"add method={owners[0]}"
                if len(owners) == 1
                else f"add method= one of {', '.join(owners)}"
            )
            link.errors.append(
                f"{key} is a parameter of {', '.join(owners)}, not of {method} ({hint})"
            )
        else:
            link.errors.append(f"unknown link parameter {key!r}")
    for key, raw in given.items():
        value = attempt(lambda key=key, raw=raw: parse_param(by_name[key], raw))
        if value is not None:
            link.params[key] = value
    if "draft" in link.params:
        try:
            check_draft(link.params)
        except InvalidInput as exc:
            link.errors.append(str(exc))
            del link.params["draft"]
    return link


def _link_budget(raw: str) -> int:
    try:
        number = float(raw)
    except ValueError:
        number = math.nan
    return check_budget(number, shown=raw)


def _link_params(raw: str, m: Any) -> dict[str, Any]:
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"params is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(values, dict):
        raise InvalidInput(
            f"params must be a JSON object of {m.name}'s parameters, got {type(values).__name__}"
        )
    names = {p.name for p in m.knobs}
    unknown = sorted(set(values) - names)
    if unknown:
        raise InvalidInput(
            f"params: {unknown[0]!r} is not a parameter of {m.name}; valid: "
            f"{', '.join(sorted(names)) or 'none'}"
        )
    return values
