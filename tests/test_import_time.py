"""``import rnn_functional`` is cheap: it adds little to its dependencies' import time and never
imports ``triton`` or ``torch._dynamo`` itself (the triton backend and the precision settings load
them when first used).

Measured in fresh subprocesses. tensordict (a dependency) imports ``torch._dynamo`` (and, through it,
``triton`` when installed) at import time (tensordict 0.14 wraps functorch functions with
``torch.compiler.allow_in_graph``): those seconds are tensordict's, so the timing starts after
``import torch, tensordict, tensordict.nn``, and the import check looks at who runs each import
statement rather than at ``sys.modules``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap

import torch

MAX_SECONDS = 0.3  # measured ~0.07 s on 2 shared CPU cores
RUNS = 3
WATCHED = ("triton", "torch._dynamo")

_SCRIPT = textwrap.dedent(
    """
    import builtins, importlib, json, sys, time
    import torch, tensordict, tensordict.nn  # dependencies (they load torch._dynamo themselves)

    WATCHED = {watched!r}
    SKIPPED = ("torch", "importlib", "_frozen_importlib", "__main__")
    importers = []

    def importer(frame):
        # The innermost module outside torch and importlib that runs the import.
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if not name.split(".")[0] in SKIPPED:
                return name
            frame = frame.f_back
        return "?"

    def watched(name):
        return any(name == w or name.startswith(w + ".") for w in WATCHED)

    real_import, real_import_module = builtins.__import__, importlib.import_module

    def watching_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and watched(name):
            importers.append([name, importer(sys._getframe(1))])
        return real_import(name, globals, locals, fromlist, level)

    def watching_import_module(name, package=None):
        if watched(name):
            importers.append([name, importer(sys._getframe(1))])
        return real_import_module(name, package)

    builtins.__import__, importlib.import_module = watching_import, watching_import_module
    start = time.perf_counter()
    import rnn_functional
    seconds = time.perf_counter() - start
    builtins.__import__, importlib.import_module = real_import, real_import_module
    ours = [pair for pair in importers if pair[1].split(".")[0] == "rnn_functional"]
    print(json.dumps({{"seconds": seconds, "ours": ours}}))
    """
).format(watched=WATCHED)


def _run_import() -> dict:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_is_fast_and_loads_neither_triton_nor_dynamo() -> None:
    runs = [_run_import() for _ in range(RUNS)]
    imports = {tuple(pair) for run in runs for pair in run["ours"]}
    assert not imports, (
        f"rnn_functional imports {sorted(imports)} (module, importer) when imported; import them where they "
        "are first needed."
    )
    median = statistics.median(run["seconds"] for run in runs)
    assert median < MAX_SECONDS, (
        f"import rnn_functional took {median:.3f} s (median of {RUNS}) after torch and tensordict; "
        f"expected < {MAX_SECONDS} s. Find the cost with: python -X importtime -c 'import rnn_functional'"
    )


def test_precision_marks_resolution_constant_as_torch_does() -> None:
    """``precision.py`` sets the attribute ``torch.compiler.assume_constant_result`` sets (to stay
    lazy); if torch changes what the decorator does, this fails."""
    from rnn_functional.precision import resolve_matmul_precision

    def probe() -> None:
        pass

    torch.compiler.assume_constant_result(probe)
    assert vars(probe) == {"_dynamo_marked_constant": True}
    assert resolve_matmul_precision._dynamo_marked_constant is True
