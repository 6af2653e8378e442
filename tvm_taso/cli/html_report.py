"""An HTML page for a search report: the numbers, the rules applied, the search curve, and
before/after pictures of every rewritten region. Self-contained (inline SVG, no scripts)."""

from __future__ import annotations

import html
import json

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}
th{background:#f3f3f3}.num{text-align:right;font-variant-numeric:tabular-nums}
.pair{display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start}.pair div{flex:0 0 auto;overflow-x:auto;max-width:100%}
h3{margin-top:2em}svg text{font-size:11px;font-family:monospace}
"""

_COLORS = {"input": "#e8f0fe", "const": "#eeeeee", "opaque": "#fde2e2"}
_KERNEL_COLOR = "#fff4d6"
_CHANGED = "#d7f5dd"


def render(report: dict) -> str:
    """The HTML page (a string) for ``report`` as returned by :func:`tvm_taso.optimize`."""
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>tvm-taso report</title>",
        f"<style>{_STYLE}</style></head><body><h1>tvm-taso optimization report</h1>",
        "<table>",
    ]
    before, after = report["cost_before"], report["cost_after"]
    rows = [
        ("target", report.get("target") or "host CPU"),
        ("cost model", report["cost_model"]["name"]),
        ("estimated cost before", f"{before:.2f} µs"),
        ("estimated cost after", f"{after:.2f} µs"),
        ("estimated speedup", f"{report['speedup_estimate']:.3f}×"),
        ("search time", f"{report['search_seconds']:.3f} s"),
        ("graphs expanded / candidates", f"{report['expanded']} / {report['candidates']}"),
        ("regions searched", str(report["regions"])),
        ("constants folded", str(report.get("constants_folded", 0))),
    ]
    guard = report.get("guard")
    if guard:
        where = f"in {guard['runtime']}" if "runtime" in guard else "through TVM"
        rows.append(("whole-model guard", f"{guard['ratio']:.3f}× (quartiles {guard['ratio_low']:.3f}–"
                     f"{guard['ratio_high']:.3f}) measured {where}: {'kept' if guard['kept'] else 'original kept'}"
                     if guard.get("measured") else f"not measured ({guard.get('reason', '')})"))
    if "check" in report:
        c = report["check"]
        rows.append(("output check", f"max relative error {c['max_relative_error']:.2e} via {c.get('runtime', '?')}"))
    parts += [f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in rows]
    parts.append("</table><h2>Rules applied</h2>")
    if report["applied"]:
        parts.append("<table><tr><th>rule</th><th>times</th></tr>")
        parts += [f"<tr><td>{e(k)}</td><td class='num'>{v}</td></tr>" for k, v in report["applied"].items()]
        parts.append("</table>")
    else:
        parts.append("<p>None: no substitution lowered the cost.</p>")
    if report["skipped"]:
        parts.append("<h2>Left as it was</h2><ul>")
        parts += [f"<li>{e(s['what'])} (×{s['count']})</li>" for s in report["skipped"]]
        parts.append("</ul>")
    parts.append(region_verdicts(report))
    parts.append("<h2>Search curve</h2>" + curve_svg(report.get("curve", [])))
    rewrites = report.get("rewrites", [])
    if rewrites:
        parts.append("<h2>Rewritten regions</h2>")
    for rw in rewrites:
        parts.append(
            f"<h3>Region {rw['region']}: {e(', '.join(rw['rules']))}</h3>"
            f"<p>estimated cost {rw['cost_before']:.2f} µs → {rw['cost_after']:.2f} µs</p>"
            "<p><small>weights and expressions of weights (folded to constants) not drawn; new ops shaded green</small></p>"
            f"<div class='pair'><div><b>before</b><br>{graph_svg(rw['before'])}</div>"
            f"<div><b>after</b><br>{graph_svg(rw['after'], highlight_new=rw['before'])}</div></div>"
        )
    parts.append("<h2>Settings</h2><pre>" + e(json.dumps(report.get("settings", {}), indent=2)) + "</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def region_verdicts(report: dict) -> str:
    """The region guard's verdict on each rewritten region: measured speedup with its quartiles,
    kept or dropped, and why (empty when no region was timed)."""
    e = html.escape
    regions = report.get("region_guard")
    if not regions or not regions["decisions"]:
        return ""
    where = regions.get("runtime", "tvm")
    parts = [f"<h2>Regions timed ({e(where if where != 'tvm' else 'through TVM')})</h2>",
             f"<p>{regions['kept']} kept, {regions['dropped']} dropped; {regions['from_database']} from the "
             f"measurement database; {regions['seconds']:.1f} s measuring</p>",
             "<table><tr><th>region</th><th>rules</th><th>estimated µs</th><th>measured speedup</th>"
             "<th>quartiles</th><th>verdict</th></tr>"]
    for d in regions["decisions"]:
        if "ratio" in d:
            speedup, band = f"{d['ratio']:.3f}×", f"{d['ratio_low']:.3f}–{d['ratio_high']:.3f}"
        else:
            speedup, band = "–", ""
        cached = ", from the database" if d.get("from_database") else ""
        parts.append(
            f"<tr><td class='num'>{d['region']}</td><td>{e(', '.join(sorted(set(d['rules']))))}</td>"
            f"<td class='num'>{d['cost_before']:.2f} → {d['cost_after']:.2f}</td><td class='num'>{speedup}</td>"
            f"<td class='num'>{band}</td><td>{'kept' if d['kept'] else 'dropped'} ({e(d['reason'])}{cached})</td></tr>")
    parts.append("</table>")
    return "\n".join(parts)


def curve_svg(points: list, width: int = 640, height: int = 240) -> str:
    """Best estimated cost against search time, as a step plot."""
    if len(points) < 2:
        return "<p>No improvement was found, so there is no curve to plot.</p>"
    pad = 50
    ts = [p[0] for p in points]
    cs = [p[1] for p in points]
    t_max = max(ts) or 1.0
    c_min, c_max = min(cs), max(cs)
    span = (c_max - c_min) or 1.0

    def xy(t, c):
        return pad + (width - 2 * pad) * t / t_max, height - pad - (height - 2 * pad) * (c - c_min) / span

    path = []
    for i, (t, c) in enumerate(points):
        x, y = xy(t, c)
        if i:
            path.append(f"L{x:.1f},{path_y:.1f}")
        path.append(f"{'M' if not i else 'L'}{x:.1f},{y:.1f}")
        path_y = y
    x_end, _ = xy(t_max, cs[-1])
    path.append(f"L{x_end:.1f},{path_y:.1f}")
    axes = (
        f"<line x1='{pad}' y1='{height - pad}' x2='{width - pad}' y2='{height - pad}' stroke='#444'/>"
        f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{height - pad}' stroke='#444'/>"
        f"<text x='{width / 2:.0f}' y='{height - 12}' text-anchor='middle'>search time (s), 0 – {t_max:.3f}</text>"
        f"<text x='{pad - 4}' y='{pad}' text-anchor='end'>{c_max:.1f}</text>"
        f"<text x='{pad - 4}' y='{height - pad}' text-anchor='end'>{c_min:.1f}</text>"
        f"<text x='12' y='{height / 2:.0f}' transform='rotate(-90 12 {height / 2:.0f})' text-anchor='middle'>"
        "best cost (µs)</text>"
    )
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}'>{axes}"
        f"<path d='{' '.join(path)}' fill='none' stroke='#1a73e8' stroke-width='2'/></svg>"
    )


def graph_svg(graph: dict, highlight_new: dict | None = None) -> str:
    """A layered drawing of a region graph (``Graph.describe()``), producers above consumers;
    weights (constants and what is computed from them alone) are left out. With
    ``highlight_new`` (the graph before a rewrite), the ops the rewrite created are shaded."""
    nodes = [n for n in graph["nodes"] if not n.get("weight")]
    if not nodes:
        return "<p>(empty)</p>"
    depth: dict[int, int] = {}
    for n in nodes:  # nodes come in topological order
        depth[n["id"]] = 1 + max((depth[s] for s, _ in n["inputs"] if s in depth), default=-1)
    layers: dict[int, list] = {}
    for n in nodes:
        layers.setdefault(depth[n["id"]], []).append(n["id"])
    old_ids = None if highlight_new is None else {m["id"] for m in highlight_new["nodes"]}
    box_w, box_h, gap_x, gap_y = 150, 34, 16, 30
    width = max(len(v) for v in layers.values()) * (box_w + gap_x) + gap_x
    height = len(layers) * (box_h + gap_y) + gap_y
    pos = {}
    for d, ids in layers.items():
        offset = (width - len(ids) * (box_w + gap_x) + gap_x) / 2
        for k, nid in enumerate(ids):
            pos[nid] = (offset + k * (box_w + gap_x), gap_y / 2 + d * (box_h + gap_y))
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}'>"]
    for n in nodes:
        x2, y2 = pos[n["id"]]
        for s, _ in n["inputs"]:
            if s in pos:
                x1, y1 = pos[s]
                out.append(
                    f"<line x1='{x1 + box_w / 2:.0f}' y1='{y1 + box_h:.0f}' x2='{x2 + box_w / 2:.0f}' "
                    f"y2='{y2:.0f}' stroke='#888'/>"
                )
    for n in nodes:
        x, y = pos[n["id"]]
        color = _COLORS.get(n["op"], _KERNEL_COLOR)
        if old_ids is not None and n["op"] not in _COLORS and n["id"] not in old_ids:
            color = _CHANGED
        label = html.escape(n["op"])
        ty = html.escape(n["types"][0] if len(n["types"]) == 1 else f"{len(n['types'])} outputs")
        out.append(
            f"<rect x='{x:.0f}' y='{y:.0f}' width='{box_w}' height='{box_h}' rx='4' fill='{color}' stroke='#666'/>"
            f"<text x='{x + box_w / 2:.0f}' y='{y + 14:.0f}' text-anchor='middle'>{label}</text>"
            f"<text x='{x + box_w / 2:.0f}' y='{y + 27:.0f}' text-anchor='middle' fill='#555'>{ty[:24]}</text>"
        )
    out.append("</svg>")
    return "".join(out)
