"""The SVG plot, written by hand: valid XML, arms where their figures put them."""

from __future__ import annotations

from xml.etree import ElementTree

from debatebus.evaluation._plot import Point, accuracy_tokens_svg, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"


def test_ticks_are_round_and_cover_the_top() -> None:
    assert nice_ticks(966.0) == [0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]
    assert nice_ticks(7.5) == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert nice_ticks(30_000.0) == [0.0, 5000.0, 10000.0, 15000.0, 20000.0, 25000.0, 30000.0]
    assert nice_ticks(0.0) == [0.0, 1.0]


def test_points_land_by_tokens_and_accuracy_and_unknown_tokens_are_named() -> None:
    svg = accuracy_tokens_svg([
        Point("single", 100.0, 0.3, 0.1, 0.6),
        Point("<debate & co>", 900.0, 0.9, 0.7, 1.0),
        Point("fleet", None, 0.5, 0.3, 0.7),
    ])
    root = ElementTree.fromstring(svg)  # escaped: it parses
    circles = {c.get("data-arm"): c for c in root.iter(f"{SVG}circle")}
    assert set(circles) == {"single", "<debate & co>"}
    single, debate = circles["single"], circles["<debate & co>"]
    assert float(debate.get("cx", "0")) > float(single.get("cx", "0"))  # more tokens: right
    assert float(debate.get("cy", "0")) < float(single.get("cy", "0"))  # more right: up
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert "tokens unknown, not plotted: fleet" in texts
    assert "<debate & co>" in texts
