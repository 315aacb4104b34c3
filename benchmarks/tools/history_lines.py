"""Count run-history lines in ``docs/``: paragraph lines (outside code blocks, tables and headings) that carry a date,
a count of runs, a machine's name, or a measured figure told in the past tense.

    python benchmarks/tools/history_lines.py [docs]    # per page: history lines / lines, and the total
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DATE = r"\b20\d\d-\d\d-\d\d\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}\b"
ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\w+teenth|\d+(?:st|nd|rd|th))"
RUNS = (rf"\b(?:{ORDINAL}|one|two|three|four|five|six|seven|eight|nine|ten|\d+)\s+(?:runs?|leases?|re-?runs?)\b"
        r"|\b(?:run|lease)\s*#?\d+\b")
MACHINE = r"\b(?:H100|H200|A100|A10G?|V100|L4|T4|RTX\s?\d+|EPYC|Xeon|Ryzen|Skylake|Icelake|Sapphire Rapids|Milan|Genoa|\d+-core)\b"
FIGURE = r"\d(?:\.\d+)?\s*(?:x|%|ms|us|µs|s|ns|MiB|GiB|GB|MB)\b"
PAST = r"\b(?:took|ran|was|were|met|missed)\b"
HISTORY = re.compile(rf"{DATE}|{RUNS}|{MACHINE}", re.IGNORECASE)


def _is_history(paragraph: str) -> bool:
    return bool(HISTORY.search(paragraph)
                or (re.search(FIGURE, paragraph) and re.search(PAST, paragraph, re.IGNORECASE)))


def history_lines(text: str) -> tuple[int, int]:
    """``(history, total)`` line counts of one Markdown page: every line of a paragraph (consecutive prose lines,
    list items included) that carries a marker counts."""
    history = total = 0
    fenced = False
    paragraph: list[str] = []

    def close() -> int:
        found = len(paragraph) if paragraph and _is_history(" ".join(paragraph)) else 0
        paragraph.clear()
        return found

    for line in text.splitlines():
        total += 1
        stripped = line.strip()
        if stripped.startswith("```"):
            history += close()
            fenced = not fenced
        elif fenced or not stripped or stripped.startswith(("|", "#", "![")):
            history += close()
        else:
            paragraph.append(stripped)
    return history + close(), total


def count(docs: Path) -> dict[str, tuple[int, int]]:
    """Page (relative to ``docs``) -> ``(history, total)``."""
    return {str(p.relative_to(docs)): history_lines(p.read_text()) for p in sorted(docs.rglob("*.md"))}


def main(argv: list[str]) -> None:
    pages = count(Path(argv[0]) if argv else Path(__file__).resolve().parents[2] / "docs")
    for page, (h, n) in pages.items():
        print(f"{page:32s} {h:4d} / {n:4d}")
    h, n = (sum(v[i] for v in pages.values()) for i in (0, 1))
    print(f"{'total':32s} {h:4d} / {n:4d} ({100 * h / max(n, 1):.1f}%)")


if __name__ == "__main__":
    main(sys.argv[1:])
