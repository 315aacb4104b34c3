"""The documentation builds without warnings, its examples run, and it holds little run history.

* ``mkdocs build --strict`` over ``mkdocs.yml`` (API reference from the docstrings included);
* every ```` ```python ```` block of every page runs, page by page in one namespace (blocks fenced ```` ```py ````
  are shown, not run: fragments that need a pipeline or a GPU); ``model_based.md``'s blocks run in the tests of
  their cells (``tests/test_norm_gru.py``, ``tests/modules/test_dreamer_block_gru.py``);
* run-history lines (``benchmarks/tools/history_lines.py``) are at most 10% of ``docs/``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from benchmarks.tools import history_lines

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TESTED_ELSEWHERE = {"model_based.md"}


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.MULTILINE | re.DOTALL)


RUN_PAGES = sorted(p.name for p in DOCS.glob("*.md") if _python_blocks(p) and p.name not in TESTED_ELSEWHERE)


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (it comes with the test extra)")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (it comes with the test extra)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert not warnings, "mkdocs warnings:\n" + "\n".join(warnings)
    assert (tmp_path / "site" / "api" / "functional" / "index.html").read_text().count("lstm_sequence") > 0


def test_every_user_page_has_an_example_that_runs() -> None:
    assert {"index.md", "functional.md", "resets.md", "backends.md", "migrating.md", "compile.md", "ensembles.md",
            "linear_recurrences.md", "gpu.md"} <= set(RUN_PAGES)


def test_api_reference_renders_public_names_only() -> None:
    import rnn_functional

    for page in (DOCS / "api").glob("*.md"):
        for name in re.findall(r"^::: (\S+)", page.read_text(), flags=re.MULTILINE):
            assert name.startswith("rnn_functional.") and name.count(".") == 1, f"{page.name}: {name} is not public"
            assert name.split(".")[1] in rnn_functional.__all__, f"{page.name}: {name} is not in rnn_functional.__all__"


@pytest.mark.parametrize("page", RUN_PAGES)
def test_doc_examples_run(page: str) -> None:
    blocks = _python_blocks(DOCS / page)
    # the page's namespace is a registered module: Dynamo reads a compiled function's globals through sys.modules
    module = types.ModuleType(f"docs_{Path(page).stem}")
    sys.modules[module.__name__] = module
    try:
        for i, code in enumerate(blocks):
            try:
                exec(compile(code, f"docs/{page}[block {i}]", "exec"), module.__dict__)
            except Exception as exc:  # name the block in the failure
                raise AssertionError(f"docs/{page}, python block {i} failed: {exc!r}\n{code}") from exc
    finally:
        del sys.modules[module.__name__]


def test_history_lines_counts_paragraphs_outside_code_and_tables() -> None:
    text = "\n".join(["# Title", "", "A paragraph that took 3 ms", "on the second line.", "", "```", "ran 5 ms",
                      "```", "| table | 2026-11-27 |", "", "Plain prose.", "", "- a list item on an H200"])
    assert history_lines.history_lines(text) == (2 + 1, 13)


def test_run_history_is_at_most_a_tenth_of_the_docs() -> None:
    pages = history_lines.count(DOCS)
    history, total = (sum(v[i] for v in pages.values()) for i in (0, 1))
    assert history <= 0.10 * total, f"{history} of {total} docs lines are run history: {pages}"
