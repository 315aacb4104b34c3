"""How long is the walk: the Python calls one warm eager call makes inside the package (and TorchRL's, side by side).

    python benchmarks/walk.py [--list NAME] [--json OUT]

Counts ``sys.setprofile`` "call" events whose code lives in ``rnn_functional/`` (for TorchRL's modules: in
``torchrl/modules/tensordict_module/``) during the third call of each case (B=4, T=10, F=8, H=16, one interior reset):
calls, distinct functions (comprehensions and lambdas count: each is a frame in Python 3.11) and distinct files;
``named``: the distinct functions less the list, dict and set comprehensions, which Python 3.12 inlines (PEP 709).
``--list NAME`` prints the functions of the cases whose name contains NAME.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from tensordict import TensorDict

import rnn_functional as rf

B, T, F, H = 4, 10, 8, 16
OURS, TORCHRL = "/rnn_functional/", "/torchrl/modules/tensordict_module/"


def count(fn, where: str) -> tuple[int, list[tuple[str, str, int]]]:
    """``(calls, sorted distinct (file, function, line))`` of the third call of ``fn`` in files under ``where``."""
    calls, seen = 0, set()

    def profile(frame, event, arg):
        nonlocal calls
        path = frame.f_code.co_filename
        if event == "call" and where in path:
            calls += 1
            seen.add((path.split(where, 1)[1], frame.f_code.co_name, frame.f_code.co_firstlineno))

    fn(), fn()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls, sorted(seen)


def cases() -> dict[str, tuple[object, str]]:
    """``{name: (call, package path)}``."""
    g = torch.Generator().manual_seed(0)
    is_init = torch.zeros(B, T, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[1, 5] = True
    out = {}
    libs = [("", rf, OURS)]
    try:
        import torchrl.modules as trl
        libs.append(("TorchRL ", trl, TORCHRL))
    except ImportError:
        pass
    for prefix, lib, where in libs:
        for cls, keys in (("LSTMModule", ("recurrent_state_h", "recurrent_state_c")), ("GRUModule", ("recurrent_state",))):
            def td(step: bool, keys=keys) -> TensorDict:
                shape = [B] if step else [B, T]
                data = {"x": torch.randn(*shape, F, generator=g), "is_init": is_init[:, 1] if step else is_init}
                data.update({k: torch.zeros(*shape, 1, H) for k in keys})
                return TensorDict(data, shape)
            for backend in ("pad", "auto", "scan", "reference"):
                if prefix and backend in ("auto", "reference"):
                    continue
                module = getattr(lib, cls)(input_size=F, hidden_size=H, in_key="x", out_key="y",
                                           recurrent_backend=backend, default_recurrent_mode=True)
                out[f"{prefix}{cls} recurrent {backend}"] = (lambda m=module, d=td(False): m(d.clone(False)), where)
            module = getattr(lib, cls)(input_size=F, hidden_size=H, in_key="x", out_key="y")
            out[f"{prefix}{cls} step"] = (lambda m=module, d=td(True): m(d.clone(False)), where)
    lstm, gru = rf.init_lstm_params(F, H, generator=g), rf.init_gru_params(F, H, generator=g)
    x1, xs, h = torch.randn(B, F, generator=g), torch.randn(B, T, F, generator=g), torch.zeros(B, 1, H)
    out["lstm_step"] = (lambda: rf.lstm_step(x1, (h, h), lstm, is_init=is_init[:, 1, 0]), OURS)
    out["gru_step"] = (lambda: rf.gru_step(x1, h, gru, is_init=is_init[:, 1, 0]), OURS)
    for backend in ("auto", "pad", "scan", "reference"):
        out[f"lstm_sequence {backend}"] = (
            lambda b=backend: rf.lstm_sequence(xs, (h, h), lstm, is_init=is_init[..., 0], backend=b), OURS)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", default=None, help="print the functions of the cases whose name contains this")
    parser.add_argument("--json", default=None, help="write the counts here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = {}
    print(f"{'call':36s} {'calls':>6s} {'functions':>9s} {'named':>5s} {'files':>5s}")
    for name, (fn, where) in cases().items():
        calls, functions = count(fn, where)
        named = [f for f in functions if f[1] not in ("<listcomp>", "<dictcomp>", "<setcomp>")]
        rows[name] = {"calls": calls, "functions": len(functions), "named": len(named),
                      "files": len({f for f, _, _ in functions})}
        print(f"{name:36s} {calls:6d} {rows[name]['functions']:9d} {rows[name]['named']:5d} {rows[name]['files']:5d}")
        if args.list and args.list in name:
            for function in functions:
                print("    ", *function)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
