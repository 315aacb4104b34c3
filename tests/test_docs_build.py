"""The documentation builds without warnings, its examples run, and its benchmark tables are generated.

* ``mkdocs build --strict`` over ``mkdocs.yml`` (API reference from the docstrings included);
* every ```` ```python ```` block of the user guide pages runs, page by page in one namespace
  (blocks fenced ```` ```py ```` are shown, not run: fragments that need a pipeline or a GPU);
* the GENERATED block of ``docs/benchmarks.md`` equals what ``benchmarks/plot.py`` writes from the
  committed results JSON (so its tables are never edited by hand).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUN_PAGES = ["index.md", "functional.md", "resets.md", "backends.md", "migrating.md", "ensembles.md", "linear_recurrences.md"]


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


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", RUN_PAGES)
def test_doc_examples_run(page: str) -> None:
    blocks = _python_blocks(DOCS / page)
    assert blocks, f"docs/{page} has no ```python block to run"
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


def test_benchmark_tables_are_generated() -> None:
    pytest.importorskip("matplotlib", reason="benchmarks/plot.py needs matplotlib")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import plot
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    files = plot.result_files()
    if not files:
        pytest.skip("no benchmark results committed under benchmarks/results/")
    text = (DOCS / "benchmarks.md").read_text()
    generated = text.split(plot.BEGIN, 1)[1].split(plot.END, 1)[0]
    expected = plot.generated_block([(f, json.loads(f.read_text())) for f in files])
    assert generated == expected, "docs/benchmarks.md is out of date: run `python benchmarks/plot.py`"
