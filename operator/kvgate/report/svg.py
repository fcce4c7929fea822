"""The report's charts as inline SVG: accuracy and KV tokens per arm, score against context."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final, NamedTuple

from kvgate.records.loadresult import ARMS, StagePoint
from kvgate.report.fmt import e, fmt_int, kilo, pct, to_pp, wilson
from kvgate.report.records import ReportView

_COLORS: Final = {"control": "#5b6f95", "candidate": "#d9822b"}


class _Point(NamedTuple):
    """An arm with a score, as the accuracy panel draws it."""

    accuracy: float
    wilson: tuple[float, ...]  # (low, high), or () without one


def render_svg(view: ReportView) -> str:
    """Two panels side by side: accuracy with Wilson intervals, and KV tokens, per arm."""
    acc = view.accuracy
    width, height, pad = 640, 260, 44
    panel = (width - 3 * pad) / 2
    top, bottom = 36, height - 40
    parts = [_open(width, height, "Accuracy with 95% Wilson intervals and KV cache tokens per arm")]
    # Left panel: accuracy. The axis spans the intervals with some room, so small
    # differences stay visible instead of being flattened against a 0-100% axis.
    x0 = pad
    parts.append(f'<text x="{x0}" y="20" font-weight="600">Accuracy, 95% Wilson interval</text>')
    points = {
        arm: _Point(a.accuracy, a.wilson95)
        for arm, a in (acc.arms.items() if acc else [])
        if a.accuracy is not None
    }
    if points:
        lows = [a.wilson[0] if a.wilson else a.accuracy for a in points.values()]
        highs = [a.wilson[1] if a.wilson else a.accuracy for a in points.values()]
        lo = max(0.0, min(lows) - 0.02)
        hi = min(1.0, max(highs) + 0.02)
        if hi - lo < 0.04:
            hi, lo = min(1.0, hi + 0.02), max(0.0, lo - 0.02)

        def y_of(v: float) -> float:
            return bottom - (v - lo) / (hi - lo) * (bottom - top)

        for tick in _ticks(lo, hi):
            y = y_of(tick)
            parts.append(
                f'<line x1="{x0}" x2="{x0 + panel:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                'stroke="#eef1f6"/>'
                f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#5b6475">'
                f"{100 * tick:.0f}%</text>"
            )
        for i, arm in enumerate(ARMS):
            a = points.get(arm)
            if a is None:
                continue
            cx = x0 + panel * (i + 1) / 3
            color = _COLORS[arm]
            if a.wilson:
                y1, y2 = y_of(a.wilson[0]), y_of(a.wilson[1])
                parts.append(
                    f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" '
                    f'stroke="{color}" stroke-width="2"/>'
                    f'<line x1="{cx - 10:.1f}" x2="{cx + 10:.1f}" y1="{y1:.1f}" y2="{y1:.1f}" '
                    f'stroke="{color}" stroke-width="2"/>'
                    f'<line x1="{cx - 10:.1f}" x2="{cx + 10:.1f}" y1="{y2:.1f}" y2="{y2:.1f}" '
                    f'stroke="{color}" stroke-width="2"/>'
                )
            cy = y_of(a.accuracy)
            parts.append(
                f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{color}">'
                f"<title>{e(arm)}: {pct(a.accuracy)} {wilson(a.wilson)}</title></circle>"
                f'<text x="{cx + 14:.1f}" y="{cy + 4:.1f}" fill="{color}">'
                f"{pct(a.accuracy)}</text>"
                f'<text x="{cx:.1f}" y="{bottom + 18}" text-anchor="middle">{e(arm)}</text>'
            )
    else:
        parts.append(_no_data(x0, panel, top, bottom, f"no accuracy {_missing(view)}"))
    # Right panel: KV tokens as bars from zero, because the point is the ratio.
    x1 = 2 * pad + panel
    parts.append(f'<text x="{x1}" y="20" font-weight="600">KV cache size (tokens)</text>')
    known = {arm: t for arm in ARMS if (t := view.kv_tokens[arm]) is not None}
    if known:
        peak = max(known.values()) or 1.0
        bar = panel / 4
        for i, arm in enumerate(ARMS):
            value = known.get(arm)
            cx = x1 + panel * (i + 1) / 3
            parts.append(
                f'<text x="{cx:.1f}" y="{bottom + 18}" text-anchor="middle">{e(arm)}</text>'
            )
            if value is None:
                continue
            h = value / peak * (bottom - top - 16)
            parts.append(
                f'<rect x="{cx - bar / 2:.1f}" y="{bottom - h:.1f}" width="{bar:.1f}" '
                f'height="{h:.1f}" fill="{_COLORS[arm]}" rx="3">'
                f"<title>{e(arm)}: {fmt_int(value)} tokens</title></rect>"
                f'<text x="{cx:.1f}" y="{bottom - h - 5:.1f}" text-anchor="middle">'
                f"{fmt_int(value)}</text>"
            )
        parts.append(
            f'<line x1="{x1}" x2="{x1 + panel:.1f}" y1="{bottom}" y2="{bottom}" stroke="#9aa5b8"/>'
        )
        gain = view.capacity_gain
        if gain is not None:
            parts.append(
                f'<text x="{x1 + panel:.1f}" y="20" text-anchor="end" fill="#5b6475">'
                f"{gain:.2f}x</text>"
            )
    else:
        parts.append(_no_data(x1, panel, top, bottom, f"no KV figures {_missing(view)}"))
    parts.append("</svg>")
    return "".join(parts)


def _open(width: int, height: int, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{label}" '
        'font-family="system-ui,sans-serif" font-size="12">'
    )


def _missing(view: ReportView) -> str:
    """Why a figure is absent: not yet, or never (the rollout ended before measuring it)."""
    return "(not measured)" if view.finished else "yet"


def _no_data(x: float, w: float, top: float, bottom: float, text: str) -> str:
    return (
        f'<text x="{x + w / 2:.1f}" y="{(top + bottom) / 2:.1f}" text-anchor="middle" '
        f'fill="#9aa5b8">{e(text)}</text>'
    )


_ACCURACY_STEPS: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.25)
_PP_STEPS: Final = (0.5, 1, 2, 5, 10, 20, 50, 100)


def _ticks(
    lo: float, hi: float, steps: tuple[float, ...] = _ACCURACY_STEPS, most: int = 6
) -> list[float]:
    """Round ticks from `lo` to `hi`: the first of `steps` giving at most `most`, else the last."""
    step = next((s for s in steps if (hi - lo) / s <= most), steps[-1])
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 6) for i in range(int((hi - first) / step + 1e-9) + 1)]


def render_long_context_svg(view: ReportView) -> str:
    """Score against context length for both arms (log2 x axis), or '' without buckets."""
    points = [
        (math.log2(b.context_length), b.control, b.candidate, b.context_length)
        for b in view.long_context
        if b.context_length and b.context_length > 0
        and b.control is not None and b.candidate is not None
    ]  # fmt: skip
    if not points:
        return ""
    w, h, left, right, top, bottom = 480, 220, 50, 20, 15, 35
    lo, hi = points[0][0], points[-1][0]
    span = max(hi - lo, 1.0)

    def x(v: float) -> float:
        return left + (v - lo) / span * (w - left - right)

    def y(v: float) -> float:
        return top + (1 - v) * (h - top - bottom)

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' role='img' "
        "aria-label='score against context length'>",
        f"<line x1='{left}' y1='{y(0)}' x2='{w - right}' y2='{y(0)}' stroke='#888'/>",
        f"<line x1='{left}' y1='{y(0)}' x2='{left}' y2='{y(1)}' stroke='#888'/>",
    ]
    for v in (0.0, 0.5, 1.0):
        parts.append(f"<text x='{left - 6}' y='{y(v) + 4}' text-anchor='end'>{v:.0%}</text>")
    for px, _, _, n in points:
        parts.append(f"<text x='{x(px)}' y='{h - 12}' text-anchor='middle'>{kilo(n)}</text>")
    for index, colour, label in ((1, "#1f77b4", "control"), (2, "#d62728", "candidate")):
        line = " ".join(f"{x(pt[0]):.1f},{y(pt[index]):.1f}" for pt in points)
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{line}'/>")
        parts += [
            f"<circle cx='{x(pt[0]):.1f}' cy='{y(pt[index]):.1f}' r='3' fill='{colour}'/>"
            for pt in points
        ]
        parts.append(
            f"<text x='{w - right}' y='{top + 14 * index}' text-anchor='end' "
            f"fill='{colour}'>{label}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def render_difference_svg(view: ReportView) -> str:
    """The paired difference (candidate minus control, pp) with its bounds against the margin.

    One row: the point estimate, the look-adjusted one-sided bounds the verdict rests on (the
    two-sided interval when the summary has none), zero, and a dashed line at minus the margin,
    green when the gate passed and red when it failed. '' without a difference.
    """
    acc = view.accuracy
    if acc is None or acc.difference is None:
        return ""
    diff = to_pp(acc.difference)
    adjusted = acc.lower_bound is not None or acc.upper_bound is not None
    if adjusted:
        low = to_pp(acc.lower_bound) if acc.lower_bound is not None else None
        high = to_pp(acc.upper_bound) if acc.upper_bound is not None else None
        label = "look-adjusted one-sided bounds"
    elif acc.difference_ci is not None:
        low, high = (to_pp(v) for v in acc.difference_ci)
        label = "two-sided 95% interval"
    else:
        low = high = None
        label = "no interval"
    margin = abs(to_pp(acc.margin)) if acc.margin else None
    values = [0.0, diff, *(v for v in (low, high) if v is not None)]
    if margin is not None:
        values.append(-margin)
    span = max(values) - min(values)
    pad = max(0.5, 0.12 * span)
    lo, hi = min(values) - pad, max(values) + pad
    w, h, left, right, row = 640, 130, 20, 20, 62

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (w - left - right)

    colour = {"pass": "#17612a", "fail": "#8a1c17"}.get(acc.verdict or "", "#7a5500")
    parts = [
        _open(w, h, "Paired difference, candidate minus control, against the margin"),
        f'<text x="{left}" y="18" font-weight="600">Candidate - control (pp), {e(label)}</text>',
    ]
    for tick in _ticks(lo, hi, _PP_STEPS, 8):
        parts.append(
            f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="34" y2="{h - 28}" stroke="#eef1f6"/>'
            f'<text x="{x(tick):.1f}" y="{h - 12}" text-anchor="middle" fill="#5b6475">'
            f"{tick:+g}</text>".replace(">+0<", ">0<")
        )
    parts.append(f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="30" y2="{h - 28}" stroke="#9aa5b8"/>')
    if margin is not None:
        parts.append(
            f'<line x1="{x(-margin):.1f}" x2="{x(-margin):.1f}" y1="30" y2="{h - 28}" '
            f'stroke="{colour}" stroke-width="2" stroke-dasharray="5,4"/>'
            f'<text x="{x(-margin) + 4:.1f}" y="42" fill="{colour}">margin -{margin:g} pp</text>'
        )
    if low is not None or high is not None:
        a = x(low if low is not None else diff)
        b = x(high if high is not None else diff)
        parts.append(
            f'<line x1="{a:.1f}" x2="{b:.1f}" y1="{row}" y2="{row}" stroke="{colour}" '
            'stroke-width="3"/>'
        )
        for v in (low, high):
            if v is not None:
                parts.append(
                    f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{row - 8}" y2="{row + 8}" '
                    f'stroke="{colour}" stroke-width="2"/>'
                )
    bounds = ", ".join(f"{v:+.1f}" for v in (low, high) if v is not None)
    parts.append(
        f'<circle cx="{x(diff):.1f}" cy="{row}" r="6" fill="{colour}">'
        f"<title>candidate - control {diff:+.1f} pp"
        + (f" [{e(bounds)}]" if bounds else "")
        + f"</title></circle>"
        f'<text x="{x(diff):.1f}" y="{row + 24}" text-anchor="middle" fill="{colour}">'
        f"{diff:+.1f} pp</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def render_load_svg(view: ReportView) -> str:
    """Throughput and TPOT against concurrency for both arms, production's load marked.

    Two panels on a log2 concurrency axis; a line joins each arm's measured stages, an error
    stage is an x on the axis (not a measurement), and a dashed line marks production's
    concurrency. '' without a load.
    """
    load = view.load
    if load is None:
        return ""
    width, height, pad = 640, 260, 52
    panel = (width - 3 * pad) / 2
    top, bottom = 36, height - 44
    lo, hi = math.log2(load.levels[0]), math.log2(load.levels[-1])
    span = max(hi - lo, 1.0)
    parts = [_open(width, height, "Output throughput and TPOT against concurrency per arm")]
    panels: tuple[tuple[str, Callable[[StagePoint], float | None]], ...] = (
        ("Output tok/s against concurrency", lambda s: s.output_tokens_per_s),
        ("TPOT p50 (ms) against concurrency", lambda s: s.tpot_p50_ms),
    )
    for index, (title, value_of) in enumerate(panels):
        x0 = pad + index * (panel + pad)

        def x(level: int, x0: float = x0) -> float:
            return x0 + (math.log2(level) - lo) / span * panel

        values = [
            v
            for stages in load.arms.values()
            for s in stages.values()
            if s.measured and (v := value_of(s)) is not None
        ]
        parts.append(f'<text x="{x0}" y="20" font-weight="600">{e(title)}</text>')
        parts.append(
            f'<line x1="{x0}" x2="{x0 + panel:.1f}" y1="{bottom}" y2="{bottom}" stroke="#9aa5b8"/>'
        )
        for level in load.levels:
            parts.append(
                f'<text x="{x(level):.1f}" y="{bottom + 16}" text-anchor="middle" '
                f'fill="#5b6475">{level}</text>'
            )
        production = load.production_concurrency
        if production is not None and production > 0:
            px = x(production)
            parts.append(
                f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top}" y2="{bottom}" stroke="#7a5500" '
                'stroke-dasharray="5,4"/>'
                f'<text x="{px:.1f}" y="{bottom + 32}" text-anchor="middle" fill="#7a5500">'
                f"production {production}</text>"
            )
        if not values:
            parts.append(_no_data(x0, panel, top, bottom, "no stage measured"))
            continue
        peak = max(values) * 1.1 or 1.0

        def y(v: float, peak: float = peak) -> float:
            return bottom - v / peak * (bottom - top)

        parts.append(
            f'<text x="{x0 - 6}" y="{y(max(values)) + 4:.1f}" text-anchor="end" '
            f'fill="#5b6475">{fmt_int(max(values))}</text>'
            f'<text x="{x0 - 6}" y="{bottom + 4}" text-anchor="end" fill="#5b6475">0</text>'
        )
        for arm in ARMS:
            color = _COLORS[arm]
            stages = sorted(load.arms.get(arm, {}).items())
            measured = [
                (level, v) for level, s in stages if s.measured and (v := value_of(s)) is not None
            ]
            if len(measured) > 1:
                line = " ".join(f"{x(level):.1f},{y(v):.1f}" for level, v in measured)
                parts.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>'
                )
            for level, v in measured:
                parts.append(
                    f'<circle cx="{x(level):.1f}" cy="{y(v):.1f}" r="4" fill="{color}">'
                    f"<title>{e(arm)} at {level}: {v:,.1f}</title></circle>"
                )
            for level, s in stages:
                if not s.measured:
                    cx, cy = x(level), bottom - 6
                    why = s.reasons[0] if s.reasons else "not measured"
                    parts.append(
                        f'<path d="M{cx - 5:.1f},{cy - 5:.1f}l10,10m0,-10l-10,10" '
                        f'stroke="{color}" stroke-width="2">'
                        f"<title>{e(arm)} at {level}: error: {e(why)}</title></path>"
                    )
        for i, arm in enumerate(ARMS):
            parts.append(
                f'<text x="{x0 + panel:.1f}" y="{top + 14 * i}" text-anchor="end" '
                f'fill="{_COLORS[arm]}">{e(arm)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
