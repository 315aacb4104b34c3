"""``recompute="full"``: same outputs and gradients as ``"none"``, less activation memory.

Gradients are compared in float64 with ``torch.testing.assert_close`` defaults against
``backend="reference", recompute="none"`` (the ground truth every backend matches).
Memory is the CPU allocator's live bytes as seen by ``torch.profiler`` (``profile_memory``):
an exact byte count of the tensors allocated and not yet freed, independent of machine load,
and, unlike ``saved_tensors_hooks``, it sees inside eager ``scan``'s higher-order op.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.profiler import ProfilerActivity, profile

import rnn_functional as rf
from rnn_functional import gru_sequence, init_gru_params, init_lstm_params, lstm_sequence

F64 = torch.float64
N, T, F, H = 3, 7, 4, 5


def _problem(cell: str, proj: int, layers: int, seed: int = 0):
    """Params, x, state, is_init (with interior resets) and reset_state, all float64 and requiring grad."""
    g = torch.Generator().manual_seed(seed)
    if cell == "lstm":
        p = init_lstm_params(F, H, layers, proj_size=proj, dtype=F64, generator=g)
        P = proj or H
        state = (torch.randn(N, layers, P, dtype=F64, generator=g), torch.randn(N, layers, H, dtype=F64, generator=g))
        reset = (torch.randn(N, T, layers, P, dtype=F64, generator=g), torch.randn(N, T, layers, H, dtype=F64, generator=g))
    else:
        p = init_gru_params(F, H, layers, dtype=F64, generator=g)
        state = torch.randn(N, layers, H, dtype=F64, generator=g)
        reset = torch.randn(N, T, layers, H, dtype=F64, generator=g)
    x = torch.randn(N, T, F, dtype=F64, generator=g)
    is_init = torch.zeros(N, T, dtype=torch.bool)
    is_init[0, 0] = is_init[0, 3] = is_init[1, 5] = is_init[2, 1] = is_init[2, 2] = True
    leaves = [x, *p.values(), *_flat(state), *_flat(reset)]
    for t in leaves:
        t.requires_grad_(True)
    return p, x, state, is_init, reset, leaves


def _flat(s) -> tuple[torch.Tensor, ...]:
    return tuple(s) if isinstance(s, tuple) else (s,)


def _loss(cell, p, x, state, is_init, reset, backend, recompute, segment_states=True):
    """A scalar touching every output: y, the final carry and the segment states."""
    fn = lstm_sequence if cell == "lstm" else gru_sequence
    out = fn(x, state, p, is_init=is_init, reset_state=reset, backend=backend, recompute=recompute,
             return_segment_states=segment_states)
    y, final = out[0], _flat(out[1])
    seg = _flat(out[2]) if segment_states else ()
    return y, y.sin().sum() + sum((s**2).sum() for s in final) + sum((1.3 * s).cos().sum() for s in seg)


CASES = [("lstm", 0), ("lstm", 3), ("gru", 0)]


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("cell,proj", CASES, ids=["lstm", "lstm_proj", "gru"])
@pytest.mark.parametrize("backend", ["reference", "scan"])
def test_full_matches_none(backend, cell, proj, layers):
    """Outputs and gradients (x, params, state, reset_state) of "full" equal "none" with resets."""
    p, x, state, is_init, reset, leaves = _problem(cell, proj, layers)
    y_ref, loss_ref = _loss(cell, p, x, state, is_init, reset, "reference", "none")
    g_ref = torch.autograd.grad(loss_ref, leaves)
    y, loss = _loss(cell, p, x, state, is_init, reset, backend, "full")
    g = torch.autograd.grad(loss, leaves)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(loss, loss_ref)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)


def test_scan_full_without_resets_or_bias():
    """No is_init (no mask in the scans) and bias=False (absent weights) on the scan path."""
    g = torch.Generator().manual_seed(1)
    p = init_lstm_params(F, H, 2, bias=False, proj_size=2, dtype=F64, generator=g).requires_grad_(True)
    x = torch.randn(N, T, F, dtype=F64, generator=g, requires_grad=True)
    outs = {}
    for backend, recompute in [("reference", "none"), ("scan", "full")]:
        y, (h, c) = lstm_sequence(x, None, p, backend=backend, recompute=recompute)
        loss = y.tanh().sum() + (c**2).sum()
        outs[backend] = (y, torch.autograd.grad(loss, [x, *p.values()]))
    torch.testing.assert_close(outs["scan"][0], outs["reference"][0])
    for a, b in zip(outs["scan"][1], outs["reference"][1]):
        torch.testing.assert_close(a, b)


def test_scan_full_with_dropout_matches_none():
    """Inter-layer dropout (training) is drawn outside the recomputed layers: same masks, same grads."""
    p, x, state, is_init, reset, leaves = _problem("lstm", 0, 2, seed=5)
    results = {}
    for recompute in ("none", "full"):
        torch.manual_seed(0)
        y, _ = lstm_sequence(x, state, p, is_init=is_init, reset_state=reset, backend="scan",
                             dropout=0.5, training=True, recompute=recompute)
        results[recompute] = (y, torch.autograd.grad(y.sin().sum(), leaves))
    torch.testing.assert_close(results["full"][0], results["none"][0])
    for a, b in zip(results["full"][1], results["none"][1]):
        torch.testing.assert_close(a, b)


def test_scan_full_under_vmap_ensemble():
    """Stacked params under torch.vmap (the ensemble path; "auto" resolves to scan there)."""
    g = torch.Generator().manual_seed(2)
    stacked = torch.stack([init_gru_params(F, H, 1, dtype=F64, generator=g) for _ in range(2)]).requires_grad_(True)
    x = torch.randn(N, T, F, dtype=F64, generator=g)
    is_init = torch.rand(N, T, generator=g) < 0.3

    def run(p, backend, recompute):
        return gru_sequence(x, None, p, is_init=is_init, backend=backend, recompute=recompute)[0]

    y = torch.vmap(lambda p: run(p, "auto", "full"))(stacked)
    y_ref = torch.stack([run(stacked[i], "reference", "none") for i in range(2)])
    torch.testing.assert_close(y, y_ref)
    g_full = torch.autograd.grad(y.sin().sum(), list(stacked.values()))
    g_ref = torch.autograd.grad(y_ref.sin().sum(), list(stacked.values()))
    for a, b in zip(g_full, g_ref):
        torch.testing.assert_close(a, b)


def test_scan_full_compiles_fullgraph():
    """torch.compile(fullgraph=True): forward and the recomputing backward both trace, also
    while saved-tensor hooks are active (``save_on_cpu``; ``torch.func.vjp`` would refuse). Tracing is Dynamo's and
    AOTAutograd's, so ``aot_eager`` checks it (Inductor runs recompute="full": compile_tests/test_compile_functional.py)."""
    torch._dynamo.reset()
    p, x, state, is_init, reset, leaves = _problem("lstm", 3, 1, seed=3)

    def loss(x, state, p, is_init, reset):
        return _loss("lstm", p, x, state, is_init, reset, "scan", "full")[1]

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    with torch.autograd.graph.save_on_cpu():
        value = compiled(x, state, p, is_init, reset)
    g = torch.autograd.grad(value, leaves)
    g_ref = torch.autograd.grad(_loss("lstm", p, x, state, is_init, reset, "reference", "none")[1], leaves)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)


def test_pad_rejects_full():
    p, x, state, is_init, reset, _ = _problem("lstm", 0, 1)
    with pytest.raises(ValueError, match=r"backend 'pad' cannot serve recompute='full'.*reference.*scan"):
        lstm_sequence(x, state, p, is_init=is_init, backend="pad", recompute="full")


def test_auto_resolves_full_to_a_backend_that_serves_it():
    """Eager "auto" with "full" runs the checkpointed reference loop, never pad."""
    p, x, state, is_init, reset, leaves = _problem("gru", 0, 1)
    route = rf.sequence_route("gru", x, p, is_init=is_init, recompute="full")
    assert route.backend in ("reference", "scan")
    y, loss = _loss("gru", p, x, state, is_init, reset, "auto", "full")
    y_ref, loss_ref = _loss("gru", p, x, state, is_init, reset, "reference", "none")
    torch.testing.assert_close(y, y_ref)
    for a, b in zip(torch.autograd.grad(loss, leaves), torch.autograd.grad(loss_ref, leaves)):
        torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------- memory


def _live_bytes(fn):
    """Run ``fn`` under the profiler; return ``(result, live bytes at the end, peak live bytes)``.

    Both counts are relative to the start of ``fn``: the CPU allocations it made and did not free.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return result, live, peak


@pytest.mark.parametrize("backend", ["reference", "scan"])
def test_full_uses_less_activation_memory(backend):
    """Held between forward and backward (outputs + saved activations), and the train-step peak.

    T=48 steps of an LSTM with H=32: "none" keeps every step's gates and nonlinearities,
    "full" only the carries (scan) or the carries at chunk boundaries (reference, sqrt(T)
    chunks). A warm-up call first, so that eager scan's one-off tracing is not counted.
    """
    g = torch.Generator().manual_seed(4)
    p = init_lstm_params(8, 32, 1, generator=g).requires_grad_(True)
    x = torch.randn(8, 48, 8, generator=g)
    is_init = torch.rand(8, 48, generator=g) < 0.1
    measured = {}
    for recompute in ("none", "full"):

        def forward():
            return lstm_sequence(x, None, p, is_init=is_init, backend=backend, recompute=recompute)[0]

        forward().sum().backward()  # warm-up
        y, held, fwd_peak = _live_bytes(forward)
        _, _, bwd_peak = _live_bytes(lambda: y.sum().backward())
        measured[recompute] = (held, max(fwd_peak, held + bwd_peak))
        del y
    (held_none, peak_none), (held_full, peak_full) = measured["none"], measured["full"]
    assert held_none > 0 and held_full > 0
    assert held_full < 0.5 * held_none, measured
    assert peak_full < 0.7 * peak_none, measured


def test_full_under_func_transforms_errors_clearly():
    """Checkpointing (reference's "full") cannot cross eager torch.func transforms: a clear error
    naming what works, instead of functorch's internal failure at backward time."""
    p, x, state, is_init, reset, _ = _problem("gru", 0, 1)
    params = p.detach()

    def loss(q, backend):
        return gru_sequence(x.detach(), None, q, is_init=is_init, backend=backend, recompute="full")[0].sum()

    with pytest.raises(ValueError, match="backend 'reference' cannot serve recompute='full' under an eager torch.func"):
        torch.vmap(lambda q: loss(q, "reference"))(torch.stack([params, params]))
    with pytest.raises(ValueError, match="Use backend 'scan' \\(or 'auto'\\)"):
        torch.func.grad(lambda q: loss(q, "reference"))(params)
    with fwAD.dual_level():  # forward-mode AD without torch.func: named as such
        dual = fwAD.make_dual(x.detach(), torch.ones_like(x))
        with pytest.raises(ValueError, match="under an eager torch.func transform or forward-mode AD"):
            gru_sequence(dual, None, params, is_init=is_init, backend="reference", recompute="full")
        tangent = fwAD.unpack_dual(gru_sequence(dual, None, params, is_init=is_init, backend="scan", recompute="full")[0])
    want = torch.func.jvp(lambda v: gru_sequence(v, None, params, is_init=is_init, backend="reference")[0],
                          (x.detach(),), (torch.ones_like(x),))
    torch.testing.assert_close(tangent.tangent, want[1])  # the fix the message names serves the call exactly


def test_auto_full_under_func_grad_runs_scan():
    """auto with recompute='full' under torch.func.grad runs scan (whose recompute crosses functorch): the
    gradient equals reference's without recompute."""
    p, x, state, is_init, reset, _ = _problem("gru", 0, 1)
    params = p.detach()

    def loss(q, backend, recompute):
        return gru_sequence(x.detach(), None, q, is_init=is_init, backend=backend, recompute=recompute)[0].pow(2).sum()

    got = torch.func.grad(lambda q: loss(q, "auto", "full"))(params)
    want = torch.func.grad(lambda q: loss(q, "reference", "none"))(params)
    for key in want.keys():
        torch.testing.assert_close(got[key], want[key])


def test_compiled_scan_saves_carries_and_only_what_the_mode_needs():
    """Under torch.compile the scan backend always differentiates through its own reverse scan
    (torch's scan backward is miscompiled by Inductor on 2.13, see backends/scan.py): "full" keeps
    only the carries; "none" the carries and what the backward reads of each step (the LSTM's
    saved gates, 4H, or their backward factors, 6H: the partitioner may move that
    elementwise precomputation into the forward); nothing more. Counted with saved-tensor hooks (the
    compiled function saves through them), leaving out the inputs and params, which are kept by the
    caller anyway. The compiler is ``aot_eager_decomp_partition``: Inductor's decompositions and min-cut partitioner
    (which decide what is saved) without its code generation; it saves the same bytes as Inductor at a fraction of
    the compile time (Inductor's lowering of these graphs: compile_tests/test_compile_functional.py)."""
    g = torch.Generator().manual_seed(6)
    p = init_lstm_params(8, 32, 1, generator=g).requires_grad_(True)
    x = torch.randn(8, 16, 8, generator=g)
    is_init = torch.rand(8, 16, generator=g) < 0.1
    inputs = {t.untyped_storage().data_ptr() for t in (x, is_init, *p.values())}
    saved = {}
    for recompute in ("none", "full"):
        fn = torch.compile(
            lambda x, is_init: lstm_sequence(x, None, p, is_init=is_init, backend="scan", recompute=recompute)[0],
            fullgraph=True, backend="aot_eager_decomp_partition",
        )
        nbytes = []

        def pack(t):
            if t.untyped_storage().data_ptr() not in inputs:
                nbytes.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(x, is_init).sum().backward()
        saved[recompute] = sum(nbytes)
    per_step_carry = 8 * 16 * (32 + 32) * 4  # h and c after every step, float32
    per_step_gates = 8 * 16 * 4 * 32 * 4  # i, f, g, o after every step
    per_step_factors = 8 * 16 * 6 * 32 * 4  # LSTMCell.backward_factors: k [4H], a [H], f [H]
    # plus small extras: a time-major copy of x (F = 8: 1/8 of the carries), the reset mask, a weight
    assert saved["full"] < 1.2 * per_step_carry, saved  # the gates would add 2.5x the carries
    assert per_step_carry + per_step_gates <= saved["none"] < 1.1 * (per_step_carry + per_step_factors), saved


class _Recomputed(torch.nn.Module):
    """A sequence call with ``recompute="full"`` inside a module, as a user exports a training-time policy."""

    def __init__(self, backend: str):
        super().__init__()
        self.backend = backend
        self.params = torch.nn.ParameterDict({k.replace(".", "_"): v for k, v in _problem("gru", 0, 2)[0].items()})

    def forward(self, x, state, is_init):
        p = {k: v for k, v in self.params.items()}
        y, final = gru_sequence(x, state, p, is_init=is_init, backend=self.backend, recompute="full")
        return y, final


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("backend", ["reference", "scan", "auto"])
def test_full_exports(backend, strict):
    """``torch.export`` of a call with ``recompute="full"`` (a training-memory option) gives the program eager runs:
    strict export of ``reference``'s checkpointing once failed inside torch ("_checkpoint_context_fn")."""
    module = _Recomputed(backend)
    _, x, state, is_init, _, _ = _problem("gru", 0, 2, seed=1)
    args = (x.detach(), state.detach(), is_init)
    want = module(*args)
    program = torch.export.export(module, args, strict=strict)
    other = torch.zeros_like(is_init)
    other[:, 0] = other[1, 4] = True  # another reset pattern than the traced one
    for mask in (is_init, other):
        torch.testing.assert_close(program.module()(args[0], args[1], mask), module(args[0], args[1], mask))
    torch.testing.assert_close(module(*args), want)
