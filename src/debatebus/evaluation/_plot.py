"""The plot of an evaluation: accuracy (with its interval) against tokens per item, one point per
arm, as an SVG document written here (no plotting library)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

_WIDTH, _HEIGHT = 720, 440
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 32, 48, 64
_Scale = Callable[[float], float]  # a plot coordinate from a value
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22")


@dataclass(frozen=True, slots=True)
class Point:
    """One arm: its mean tokens per item (None: unknown, not plotted) and its accuracy with the
    interval's bounds, all 0..1."""

    label: str
    tokens: float | None
    accuracy: float
    low: float
    high: float


def nice_ticks(top: float, most: int = 6) -> list[float]:
    """Round tick values from 0 to at least ``top`` (1, 2 or 5 times a power of ten apart), at
    most ``most`` steps."""
    if top <= 0:
        return [0.0, 1.0]
    base = 10.0 ** math.floor(math.log10(top / most))
    step = next(base * m for m in (1, 2, 5, 10) if top / (base * m) <= most)
    return [step * i for i in range(math.ceil(top / step - 1e-9) + 1)]


def accuracy_tokens_svg(points: Sequence[Point], title: str = "Accuracy against tokens") -> str:
    """The plot as an SVG document."""
    shown = [p for p in points if p.tokens is not None]
    xticks = nice_ticks(max((p.tokens or 0.0 for p in shown), default=0.0) * 1.05)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def x(tokens: float) -> float:
        return _LEFT + plot_w * tokens / xticks[-1]

    def y(share: float) -> float:
        return _TOP + plot_h * (1 - share)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_WIDTH}" height="{_HEIGHT}" fill="white"/>',
        f'<text x="{_WIDTH / 2:.1f}" y="24" text-anchor="middle" font-size="15">'
        f"{escape(title)}</text>",
        *_axes(xticks, x, y),
    ]
    for index, point in enumerate(shown):
        parts += _marker(point, index, x(point.tokens or 0.0), y)
    missing = [p.label for p in points if p.tokens is None]
    if missing:
        parts.append(f'<text x="{_LEFT}" y="{_HEIGHT - 8}" fill="#666">tokens unknown, not '
                     f'plotted: {escape(", ".join(missing))}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _axes(xticks: Sequence[float], x: _Scale, y: _Scale) -> list[str]:
    bottom, right = y(0.0), x(xticks[-1])
    parts = []
    for tick in xticks:
        parts.append(f'<line x1="{x(tick):.1f}" y1="{_TOP}" x2="{x(tick):.1f}" y2="{bottom:.1f}" '
                     'stroke="#eee"/>')
        parts.append(f'<text x="{x(tick):.1f}" y="{bottom + 18:.1f}" text-anchor="middle">'
                     f"{tick:,.0f}</text>")
    for share in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        parts.append(f'<line x1="{_LEFT}" y1="{y(share):.1f}" x2="{right:.1f}" '
                     f'y2="{y(share):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{_LEFT - 8}" y="{y(share) + 4:.1f}" text-anchor="end">'
                     f"{share:.0%}</text>")
    parts += [
        f'<line x1="{_LEFT}" y1="{bottom:.1f}" x2="{right:.1f}" y2="{bottom:.1f}" stroke="black"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom:.1f}" stroke="black"/>',
        f'<text x="{(_LEFT + right) / 2:.1f}" y="{_HEIGHT - 24}" text-anchor="middle">'
        "tokens per item (prompt + completion, mean)</text>",
        f'<text x="18" y="{(_TOP + bottom) / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 18 {(_TOP + bottom) / 2:.1f})">accuracy (95% interval)</text>',
    ]
    return parts


def _marker(point: Point, index: int, cx: float, y: _Scale) -> list[str]:
    colour = _PALETTE[index % len(_PALETTE)]
    label_y = y(point.accuracy) + (-10 if index % 2 == 0 else 18)  # alternate: fewer overlaps
    return [
        f"<g><title>{escape(point.label)}: {point.accuracy:.1%} "
        f"({point.low:.1%}–{point.high:.1%}), {point.tokens or 0:,.0f} tokens</title>",
        f'<line x1="{cx:.1f}" y1="{y(point.low):.1f}" x2="{cx:.1f}" y2="{y(point.high):.1f}" '
        f'stroke="{colour}" stroke-width="2"/>',
        *(f'<line x1="{cx - 5:.1f}" y1="{y(v):.1f}" x2="{cx + 5:.1f}" y2="{y(v):.1f}" '
          f'stroke="{colour}" stroke-width="2"/>' for v in (point.low, point.high)),
        f'<circle cx="{cx:.1f}" cy="{y(point.accuracy):.1f}" r="5" fill="{colour}" '
        f"data-arm={quoteattr(point.label)}/>",
        f'<text x="{cx + 8:.1f}" y="{label_y:.1f}" fill="{colour}">{escape(point.label)}</text>',
        "</g>",
    ]

