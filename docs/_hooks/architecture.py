"""MkDocs hook: draw docs/img/architecture.svg from the import graph when the site is built.

The picture is the package graph that tests/test_architecture.py checks, as it is at build
time, so it cannot go stale; it is an SVG written into the site (no Mermaid, whose script
would be fetched from a CDN when the page is viewed). ``python docs/_hooks/architecture.py
OUT.svg`` writes it to a file instead.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_architecture import ALLOWED_OUTWARD, LAYERS, import_graph  # noqa: E402

SRC_URI = "img/architecture.svg"


#: Where each package sits in its layer (a column of the picture), chosen so that most arrows
#: run down through empty columns; a package not named here takes the next free column.
COLUMNS = {"cli": 1, "server": 2, "integrations": 5, "client": 6, "__init__": 7, "team": 1, "protocols": 2,
           "population": 2, "learn": 1, "curate": 2, "share": 3, "engine": 4, "envs": 3, "llm": 4, "store": 5,
           "files": 1, "errors": 2, "model": 5}
LAYER_NAMES = ["data", "ports", "engine", "learning and sharing", "populations", "protocols and teams", "interfaces"]


def package_edges() -> tuple[dict[str, int], set[tuple[str, str]], set[tuple[str, str]]]:
    """Packages with their module counts; the package graph's transitive reduction (one arrow
    per dependency no other path implies); and the allowed outward imports, drawn apart."""
    graph = import_graph()

    def top(module: str) -> str:
        return module.split(".")[1] if "." in module else "__init__"

    sizes: dict[str, int] = {}
    for module in graph:
        sizes[top(module)] = sizes.get(top(module), 0) + 1
    edges = {(top(s), top(d)) for s, ds in graph.items() for d in ds if (s, d) not in ALLOWED_OUTWARD and top(s) != top(d)}
    outward = {(top(s), top(d)) for s, d in ALLOWED_OUTWARD}
    succ = {n: {b for a, b in edges if a == n} for n in sizes}

    def reaches(src: str, dst: str, skip: tuple[str, str]) -> bool:
        seen, todo = set(), [b for b in succ[src] if (src, b) != skip]
        while todo:
            n = todo.pop()
            if n == dst:
                return True
            if n not in seen:
                seen.add(n)
                todo += succ[n]
        return False

    return sizes, {e for e in edges if not reaches(*e, skip=e)}, outward


def architecture_svg() -> str:
    sizes, edges, outward = package_edges()
    box_w, box_h, col_w, row_h, left, top_m = 124, 42, 146, 96, 150, 60
    pos: dict[str, tuple[float, float]] = {}
    for i, layer in enumerate(reversed(LAYERS)):
        taken: set[int] = set()
        for pkg in sorted(p for p in layer if p in sizes and p in COLUMNS):
            taken.add(COLUMNS[pkg])
            pos[pkg] = (left + (COLUMNS[pkg] - 1) * col_w, top_m + i * row_h)
        for pkg in sorted(p for p in layer if p in sizes and p not in COLUMNS):
            col = next(c for c in range(1, 100) if c not in taken)
            taken.add(col)
            pos[pkg] = (left + (col - 1) * col_w, top_m + i * row_h)
    width = max(x for x, _ in pos.values()) + box_w + 24
    height = top_m + len(LAYERS) * row_h - 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
        'font-family="sans-serif" role="img" aria-labelledby="title">',
        '<title id="title">FORGE packages by layer; an arrow is an import that no other path implies</title>',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#444"/></marker></defs>',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#fff"/>',
        '<text x="16" y="30" font-size="14" fill="#222">Imports point down (inward); an arrow is an import no other path implies; '
        'dashed: the one allowed outward import. Drawn from tests/test_architecture.py at build time.</text>',
    ]
    for i, name in enumerate(reversed(LAYER_NAMES)):
        y = top_m + i * row_h
        out.append(f'<rect x="8" y="{y - 14}" width="{width - 16:.0f}" height="{box_h + 28}" rx="6" fill="{"#f3f5f9" if i % 2 else "#fafbfc"}"/>')
        out.append(f'<text x="20" y="{y + box_h / 2 + 5}" font-size="13" fill="#555">{html.escape(name)}</text>')

    def arrow(a: str, b: str, dashed: bool) -> str:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        if ya == yb:  # same layer: side to side
            x1, x2 = (xa + box_w, xb) if xb > xa else (xa, xb + box_w)
            d = f"M {x1:.1f} {ya + box_h / 2:.1f} L {x2:.1f} {yb + box_h / 2:.1f}"
        else:  # down (or, for the allowed outward import, up), with vertical ends
            x1, x2 = xa + box_w / 2 + (12 if dashed else 0), xb + box_w / 2 + (12 if dashed else 0)
            y1, y2 = (ya + box_h, yb) if yb > ya else (ya, yb + box_h)
            bend = (y2 - y1) / 2
            d = f"M {x1:.1f} {y1:.1f} C {x1:.1f} {y1 + bend:.1f}, {x2:.1f} {y2 - bend:.1f}, {x2:.1f} {y2:.1f}"
        style = ' stroke-dasharray="5 4"' if dashed else ""
        return f'<path d="{d}" fill="none" stroke="#444" stroke-width="1.3"{style} marker-end="url(#arrow)"/>'

    out += [arrow(a, b, False) for a, b in sorted(edges)]
    out += [arrow(a, b, True) for a, b in sorted(outward) if a in pos and b in pos]
    for pkg, (x, y) in sorted(pos.items()):
        label = "forge" if pkg == "__init__" else pkg
        note = "the package face" if pkg == "__init__" else f"{sizes[pkg]} module{'s' if sizes[pkg] > 1 else ''}"
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{box_w}" height="{box_h}" rx="5" fill="#e8eefc" stroke="#3b5bab"/>')
        out.append(f'<text x="{x + box_w / 2:.1f}" y="{y + 18}" font-size="14" text-anchor="middle" fill="#111">{html.escape(label)}</text>')
        out.append(f'<text x="{x + box_w / 2:.1f}" y="{y + 34}" font-size="11" text-anchor="middle" fill="#555">{note}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """Add the picture to the site's files, so pages can link to it as img/architecture.svg."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, SRC_URI, content=architecture_svg()))
    return files


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(architecture_svg())
