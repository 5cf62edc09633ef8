"""svg.py — a tiny SVG line-chart writer for the bench report (no plotting library needed).

Data flow: line_chart(title, x label, y label, [(name, [(x, y), ...], color or None), ...]) -> one SVG document
as a string: frame, "nice" ticks (1/2/5 x 10^k) on both axes with grid lines, one polyline per
series in a fixed palette, a legend in the top-right corner and the title on top.
"""
import math
from xml.sax.saxutils import escape

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]
W, H, L, R, T, B = 860, 420, 70, 20, 40, 50     # size and margins (left, right, top, bottom)
LEG = 240                                       # legend width


def ticks(lo, hi, n=6):
    """About n round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    out, v = [], start
    while not out or out[-1] < hi - step * 1e-9:     # the last tick is at or above hi
        out.append(round(v, 10))
        v += step
    return out if len(out) > 1 else [start, start + step]


def fmt(v):
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.3g}"


def line_chart(title, xlabel, ylabel, series):
    pts = [p for _, s, _ in series for p in s]
    xs = ticks(0, max([p[0] for p in pts] or [1]))
    ys = ticks(0, max([p[1] for p in pts] or [1]) * 1.05)
    x0, x1, y0, y1 = xs[0], xs[-1], ys[0], ys[-1]
    px = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)
    py = lambda y: H - B - (y - y0) / (y1 - y0) * (H - T - B)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>']
    for x in xs:
        o.append(f'<line x1="{px(x):.1f}" y1="{T}" x2="{px(x):.1f}" y2="{H - B}" stroke="#e5e5e5"/>')
        o.append(f'<text x="{px(x):.1f}" y="{H - B + 16}" text-anchor="middle">{fmt(x)}</text>')
    for y in ys:
        o.append(f'<line x1="{L}" y1="{py(y):.1f}" x2="{W - R}" y2="{py(y):.1f}" stroke="#e5e5e5"/>')
        o.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{fmt(y)}</text>')
    o.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#333"/>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{escape(xlabel)}</text>')
    o.append(f'<text transform="translate(16 {(T + H - B) / 2}) rotate(-90)" '
             f'text-anchor="middle">{escape(ylabel)}</text>')
    o.append(f'<rect x="{W - R - LEG - 6}" y="{T + 2}" width="{LEG + 2}" height="{17 * len(series) + 6}" '
             f'fill="white" fill-opacity="0.85" stroke="#ccc"/>')
    for i, (name, s, color) in enumerate(series):
        color = color or PALETTE[i % len(PALETTE)]
        if s:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
            o.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{path}"/>')
        ly = T + 14 + i * 17
        o.append(f'<line x1="{W - R - LEG}" y1="{ly - 4}" x2="{W - R - LEG + 22}" y2="{ly - 4}" '
                 f'stroke="{color}" stroke-width="3"/>')
        o.append(f'<text x="{W - R - LEG + 28}" y="{ly}">{escape(name)}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"
