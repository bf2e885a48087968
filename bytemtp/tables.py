"""Results as the commands print them: a plain-text table of aligned columns under a header and a
rule (`table`). No torch; it imports nothing from bytemtp, so a result on any floor can render
its own table, and the command line only prints it.
"""

from __future__ import annotations


def table(rows: list[tuple], header: tuple) -> str:
    """`rows` under `header`, each column as wide as its widest cell, a rule of dashes under the
    header, trailing spaces cut."""
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
