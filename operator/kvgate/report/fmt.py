"""How the report writes numbers, percentages, points, aligned tables and shell commands.

Takes numbers (already read from the status by `view`) and returns strings; `None` is "-".
"""

from __future__ import annotations

import html
import re
import shlex
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, Final

DASH: Final = "-"
WRAP: Final = 100  # terminal report width for long log lines and remedies


def e(value: Any) -> str:
    """`value` as HTML text, safe inside an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def fmt_int(value: float | None) -> str:
    return DASH if value is None else f"{round(value):,}"


def fmt_num(value: float | None) -> str:
    if value is None:
        return DASH
    if value == int(value) and abs(value) >= 100:
        return f"{int(value):,}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.1f}"


def pct(value: float | None) -> str:
    return DASH if value is None else f"{100.0 * value:.1f}%"


def pp(value: float | None) -> str:
    """A difference in percentage points; the summary gives fractions (-0.004 = -0.4 pp)."""
    if value is None:
        return DASH
    return f"{to_pp(value):+.1f} pp"


def to_pp(value: float) -> float:
    # Summaries write differences as fractions; a magnitude above 1 is already in pp.
    return value * 100.0 if abs(value) <= 1.0 else value


def wilson(ci: tuple[float, ...] | None) -> str:
    """A 95% interval of fractions, in percent; "-" without one (None, or not a pair)."""
    if ci is None or len(ci) != 2:
        return DASH
    return f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def fmt_mhz(mean: float | None, span: Sequence[float] = ()) -> str:
    """A clock in MHz, with its (low, high) when it moved: "1725 (1410-2040)"; "-" without a mean."""
    if mean is None:
        return DASH
    text = f"{mean:.0f}"
    if len(span) == 2 and f"{span[0]:.0f}" != f"{span[1]:.0f}":
        text += f" ({span[0]:.0f}-{span[1]:.0f})"
    return text


def humanize(key: str) -> str:
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key).replace("_", " ")
    return words[:1].upper() + words[1:].lower()


def kilo(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


def mark(status: str) -> str:
    return {"True": "ok", "False": "NO", "Unknown": "?"}.get(status, status)


def table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric_from: int = 1) -> list[str]:
    """Aligned columns: text left, numbers (columns from `numeric_from` on) right.

    A text last column that would run past the report width wraps under itself.
    """
    body = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in body) for i in range(len(header))]
    last = len(header) - 1
    indent = 2 + sum(w + 2 for w in widths[:last])
    room = max(30, WRAP - indent)
    lines = []
    for row in body:
        cells = [
            cell.rjust(widths[i]) if i >= numeric_from else cell.ljust(widths[i])
            for i, cell in enumerate(row[:last])
        ]
        tail = row[last]
        if last < numeric_from and len(tail) > room:
            parts = textwrap.wrap(tail, width=room) or [""]
            lines.append(("  " + "  ".join([*cells, parts[0]])).rstrip())
            lines += [" " * indent + p for p in parts[1:]]
            continue
        tail = tail.rjust(widths[last]) if last >= numeric_from else tail
        lines.append(("  " + "  ".join([*cells, tail])).rstrip())
    return lines


def shell_command(args: Sequence[str]) -> str:
    """`args` as a copy-pasteable shell command: the program, then one flag (and value) a line."""
    lines: list[list[str]] = [[]]
    for arg in args:
        if arg.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return " \\\n  ".join(" ".join(line) for line in lines if line)
