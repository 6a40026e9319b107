"""The report's HTML: one self-contained page (its style, script and data inline; nothing fetched).

Tables and text are written here; the charts are drawn in the browser by ``report.js`` from the page's
JSON data (inline SVG for the curves, a canvas for the heatmaps): ~20 kB of code instead of a plotting
library's megabytes, and the data travels once, compactly.
"""

from __future__ import annotations

import json
from html import escape
from importlib import resources

from smdebug.trials.divergence import json_safe

PANEL_HELP = {
    "rules": "The built-in rules that apply, evaluated over every saved step as `smdebug rules RUN` does; "
    "above the table, the rules the hook ran during training (hook.add_rule) that fired, whatever their "
    "action, and the rule that stopped training, if one did.",
    "curves": "Losses, metrics and scalars over the global step, one line per mode; dashed red lines mark "
    "the steps where a rule fired (or the first non-finite value appeared). Hover for values, drag to zoom, double-click to zoom out.",
    "gradients": "One row per layer in model order, one column per saved step: the gradient's norm. "
    "Vanishing gradients fade to dark rows, exploding ones glow; red cells hold NaN or infinity.",
    "update_ratio": "How much each weight moved between consecutive saved training steps, relative to its size "
    "(||w_t - w_prev|| / ||w_prev||); around 1e-3 is typical for SGD, far above means unstable training, "
    "far below a layer that barely learns; grey cells have no ratio (a first step, a weight that was all zeros). "
    "Needs weights saved as values.",
    "contents": "What the run holds: workers, steps each mode saved, collections, tensors, the steps "
    "it could not save (disk full, an outage) and why, and the steps found damaged.",
    "provenance": "Where the first NaN or infinity appeared, as the run recorded it.",
}


def render(data: dict, reload_seconds: float = 0.0) -> str:
    """The page for ``smdebug.report.data.collect``'s data."""
    data = dict(data, reload_seconds=reload_seconds)
    # no "<" in the data block: "<!--<script>" in a tensor name would otherwise make the HTML parser run
    # past the block's end tag and swallow the page's script ("\u003c" is the same string to JSON.parse)
    payload = json.dumps(json_safe(data), allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    style = resources.files("smdebug.report").joinpath("report.css").read_text("utf-8")
    script = resources.files("smdebug.report").joinpath("report.js").read_text("utf-8")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en" data-render="pending"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>smdebug report: {escape(data['title'])}</title>",
        f"<style>{style}</style></head><body>",
        _header(data),
        '<pre id="smdebug-errors" hidden></pre><div id="smdebug-tip" hidden></div><main>',
        _live(data, reload_seconds),
        _notes(data),
        _provenance(data),
        _curves(data),
        _heatmap_section("gradients", "heatmap-gradients", data.get("gradients"), "Gradients per layer"),
        _heatmap_section(
            "update_ratio",
            "heatmap-update-ratio",
            data.get("update_ratio"),
            "Weight-update ratio per layer",
            (data.get("unavailable") or {}).get("update_ratio"),
        ),
        _rules(data),
        _contents(data),
        "</main>",
        f'<script type="application/json" id="smdebug-data">{payload}</script>',
        f"<script>{script}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def waiting_page(run: str, reload_seconds: float = 0.0) -> str:
    """The page ``--watch`` writes until the run has its first step: it says so, and reloads itself into
    the report (without ``reload_seconds``: watching stopped before the run started)."""
    style = resources.files("smdebug.report").joinpath("report.css").read_text("utf-8")
    if reload_seconds:
        state = (
            f"Waiting for the run to write its first step; this page reloads itself every {reload_seconds:g} s "
            "and becomes the run's report."
        )
        reload = (
            f"<script>setTimeout(function () {{ location.reload(); }}, {reload_seconds * 1000:.0f});</script>"
        )
    else:
        state, reload = "Watching stopped before the run wrote its first step.", ""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>smdebug report: {escape(run)}</title><style>{style}</style></head><body>",
            f'<header><h1>smdebug report</h1><div class="meta"><span class="mono">{escape(run)}</span></div></header>',
            f'<main><section class="live" id="waiting">{escape(state)}</section></main>{reload}',
            "</body></html>",
        ]
    )


def _header(data: dict) -> str:
    state = "training ended" if data["training_ended"] else "training not ended (live or interrupted)"
    damaged = {s for steps in (data.get("damaged") or {}).values() for s in steps}
    if damaged:
        state += f", {len(damaged)} step(s) damaged"
    modes = ", ".join(f"{m} {n}" for m, n in data["modes"].items()) or "-"
    return (
        f"<header><h1>smdebug report: {escape(data['title'])}</h1>"
        f'<div class="meta"><span class="mono">{escape(data["path"])}</span> · {state} · '
        f"{data['steps']} saved steps (last {data['last_step']}; {escape(modes)}) · "
        f"{len(data['workers'])} worker(s){_shown_worker(data)} · generated {escape(data['generated'])}</div></header>"
    )


def _shown_worker(data: dict) -> str:
    """Several workers: the charts show the first one's values (``smdebug diff --workers`` compares them)."""
    workers = data["workers"]
    return f" (charts: {escape(workers[0])})" if len(workers) > 1 else ""


def _live(data: dict, reload_seconds: float) -> str:
    if not reload_seconds:
        return ""
    return (
        '<section class="live">Live: this page is regenerated while the run is written and reloads itself '
        f"every {reload_seconds:g} s.</section>"
    )


def _notes(data: dict) -> str:
    if not data["notes"]:
        return ""
    items = "".join(f"<li>{escape(n)}</li>" for n in data["notes"])
    return f'<section class="notes"><h2>Downsampled</h2><ul>{items}</ul></section>'


def _provenance(data: dict) -> str:
    found = data.get("provenance")
    if not found:
        return ""
    rows = "".join(
        f"<tr><th>{escape(str(k))}</th><td class='mono'>{escape(_text(v))}</td></tr>"
        for k, v in found.items()
    )
    return (
        '<section class="alert" id="provenance"><h2>First non-finite value</h2>'
        f'<p class="help">{PANEL_HELP["provenance"]}</p><table>{rows}</table></section>'
    )


def _rules(data: dict) -> str:
    rows = data.get("rules")
    signal = data.get("stop_signal")
    body = ""
    if signal:
        body += (
            f"<p><b>Fired during training:</b> rule <code>{escape(str(signal.get('rule')))}</code> stopped "
            f"training at step {escape(str(signal.get('step')))}: {escape(str(signal.get('reason') or ''))}</p>"
        )
    body += _training_firings(data.get("training_firings") or [])
    if rows is None:
        body += "<p>Rules were not evaluated (--no-rules).</p>"
    else:
        header = "<tr><th>Rule</th><th>Result</th><th>Fired at steps</th><th>Why</th></tr>"
        ran = [r for r in rows if r["result"] != "skipped"]
        skipped = [r for r in rows if r["result"] == "skipped"]
        fired = sum(r["result"] == "fired" for r in rows)
        body += f"<p>{fired} of {len(ran)} rule(s) fired.</p><table>{header}{_rule_rows(ran)}</table>"
        if skipped:
            body += (
                f"<details><summary>{len(skipped)} rule(s) not run: they need parameters "
                f"(<code>smdebug rules RUN --rule NAME --param K=V</code>)</summary>"
                f"<table>{header}{_rule_rows(skipped)}</table></details>"
            )
    return f'<section id="rules"><h2>Rules</h2><p class="help">{PANEL_HELP["rules"]}</p>{body}</section>'


def _training_firings(firings: list[dict], limit: int = 200) -> str:
    if not firings:
        return ""
    rows = "".join(
        f"<tr><td class='mono'>{escape(f['rule'])}</td><td>{f['step']}</td><td>{escape(f['mode'] or '-')}</td>"
        f"<td>{escape(f['worker'] or '-')}</td><td>{escape(', '.join(f['actions']) or 'none')}</td>"
        f"<td>{escape(f['reason'] or '')}</td></tr>"
        for f in firings[:limit]
    )
    more = f"<p>... and {len(firings) - limit} more.</p>" if len(firings) > limit else ""
    return (
        f'<div id="training-firings"><p><b>Fired during training:</b> {len(firings)} firing(s) of the '
        "hook's rules.</p><table><tr><th>Rule</th><th>Step</th><th>Mode</th><th>Worker</th><th>Action</th>"
        f"<th>Why</th></tr>{rows}</table>{more}</div>"
    )


def _rule_rows(rows: list[dict]) -> str:
    return "".join(
        f"<tr><td class='mono'>{escape(r['rule'])}</td><td class='{r['result']}'>{r['result']}</td>"
        f"<td>{escape(_steps(r['steps']))}</td><td>{escape(r['details'] or '')}</td></tr>"
        for r in sorted(rows, key=lambda r: ("fired", "error", "ok", "no data", "skipped").index(r["result"]))
    )


def _curves(data: dict) -> str:
    curves = data.get("curves") or []
    if not curves:
        inner = "<p>No losses, metrics or scalars were saved.</p>"
    else:
        inner = (
            '<div class="curves">'
            + "".join(
                f'<div class="curve"><h3>{escape(c["name"])}{_summary(c)}</h3><div id="curve-{i}"></div></div>'
                for i, c in enumerate(curves)
            )
            + "</div>"
        )
    return f'<section id="curves"><h2>Loss and metrics</h2><p class="help">{PANEL_HELP["curves"]}</p>{inner}</section>'


def _summary(curve: dict) -> str:
    return f' <span class="summary">({escape(curve["summary"])})</span>' if curve.get("summary") else ""


def _heatmap_section(key: str, element_id: str, heatmap: dict | None, title: str, why=None) -> str:
    if heatmap is None:
        what = "gradients" if key == "gradients" else "weights as values"
        inner = f"<p>Not available: {escape(why or f'the run saved no {what}')}.</p>"
    else:
        inner = (
            f"<p><b>{escape(heatmap['title'])}</b>: {len(heatmap['rows'])} layers × "
            f"{len(heatmap['steps'])} steps</p><div id='{element_id}'></div>"
        )
    return f'<section id="{key}"><h2>{title}</h2><p class="help">{PANEL_HELP[key]}</p>{inner}</section>'


def _per_worker(entries: dict, entry, sep: str, counted: bool = False) -> str:
    """A list item per worker: (with ``counted``, how many steps, then) its first 50 entries, each
    ``entry(key, value)``, joined by ``sep``."""
    return "".join(
        f"<li>{escape(w)}: "
        + (f"{len(some)} step(s): " if counted else "")
        + escape(sep.join(entry(k, v) for k, v in list(some.items())[:50]))
        + "</li>"
        for w, some in entries.items()
    )


def _contents(data: dict) -> str:
    unsaved = data["unsaved"]
    if unsaved:
        items = _per_worker(unsaved, lambda s, why: f"{s} ({why})", ", ", counted=True)
        lost = f"<p><b>Unsaved steps</b></p><ul>{items}</ul>"
    else:
        lost = "<p>Unsaved steps: none recorded.</p>"
    damaged = data.get("damaged") or {}
    if damaged:
        items = _per_worker(damaged, lambda s, why: f"{s}: {why}", "; ", counted=True)
        lost += f"<p><b>Damaged steps</b> (skipped: what they hold could not be read)</p><ul>{items}</ul>"
    missing = data.get("unsaved_tensors") or {}
    if missing:
        items = _per_worker(missing, lambda n, t: f"{n} from step {t['step']} ({t['reason']})", "; ")
        lost += f"<p><b>Unsaved tensors</b> (the rest of their steps was saved)</p><ul>{items}</ul>"
    collections = "".join(
        f"<tr><td class='mono'>{escape(c)}</td><td>{n}</td></tr>" for c, n in data["collections"].items()
    )
    tensors = "".join(
        f"<tr><td class='mono'>{escape(t['name'])}</td><td>{t['steps']}</td>"
        f"<td>{'-' if t['shape'] is None else escape(str(tuple(t['shape'])))}</td>"
        f"<td>{escape(', '.join(t['saved']) or '-')}</td></tr>"
        for t in data["tensors"]
    )
    return (
        f'<section id="contents"><h2>Run contents</h2><p class="help">{PANEL_HELP["contents"]}</p>'
        f"<p>Workers: {escape(', '.join(data['workers']) or '-')}</p>{lost}"
        f"<details open><summary>Collections ({len(data['collections'])})</summary>"
        f"<table><tr><th>Collection</th><th>Tensors</th></tr>{collections}</table></details>"
        f"<details><summary>Tensors ({data['tensor_count']})</summary><table><tr><th>Tensor</th><th>Steps</th>"
        f"<th>Shape</th><th>Saved</th></tr>{tensors}</table></details></section>"
    )


def _steps(steps: list[int], limit: int = 8) -> str:
    if not steps:
        return "-"
    head = ", ".join(map(str, steps[:limit]))
    return head if len(steps) <= limit else f"{head}, ... ({len(steps)} steps)"


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)
