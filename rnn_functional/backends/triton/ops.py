"""``torch.library`` ops of the fused layer kernels (forward, backward, autograd, vmap), every tensor with a leading
ensemble dim ``E`` into which vmap folds its dims. ``triton_layer_fwd``/``_bwd`` are ``triton_op``s that
``torch.compile`` sees into (CUDA); ``..._opaque`` are ``custom_op``s with fake implementations for the interpreter,
which reads data fake tensors lack. ``register_autograd`` does not serve ``torch.func.grad``/``vjp``: its wrapper lacks
the ``setup_context`` functorch requires (pytorch/pytorch#170834).
"""

import contextlib
import os
import threading
from typing import Callable, NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..base import replayed_vjp
from . import kernels
from .variant import PLAN_SMS, variant_for

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # read once: triton.jit reads it at import too
MAX_ELEMENTS = 2**31  # the kernels index their buffers with 32-bit integers
BLOCK_N = 16  # batch rows per program: tl.dot's minimum, and the most programs for the SMs
# The interpreter patches ``triton.language`` globally during a launch, so concurrent launches break each other
# ("Did you forget to add @triton.jit ?"): serialised there. Compiled CUDA launches need no lock.
_LAUNCH_LOCK = threading.Lock() if INTERPRET else contextlib.nullcontext()


def _opt(t: Optional[Tensor], dims: int, dummy: Tensor) -> tuple:
    """A pointer and its first ``dims`` strides, or a dummy pointer with zero strides."""
    return (dummy,) + (0,) * dims if t is None else (t,) + tuple(t.stride()[:dims])


def _last_contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


# (num_warps, num_stages) of the streamed kernels where the default (8, 3) spills, keyed by (cell, direction,
# operands: "bfloat16" or the fp32 matmul precision); found spill-free by benchmarks/triton_aot.py.
_STREAMED_LAUNCH = {
    ("gru", "bwd", "bfloat16"): (4, 2), ("gru", "bwd", "ieee"): (4, 2), ("gru", "bwd", "tf32"): (4, 2),
    ("gru", "fwd", "bfloat16"): (8, 1), ("lstm", "fwd", "ieee"): (8, 2),
}


def _plan(direction: str, lstm: bool, H: int, N: int, E: int, dummy: Tensor, is_init: Optional[Tensor],
          rh: Optional[Tensor], rc: Optional[Tensor], compute_dtype: str, precision: str,
          sms: Optional[int]) -> tuple[Optional[int], tuple, dict]:
    """What both launchers share: the persistent grid's row-group programs (``None``: streamed; on ``sms`` SMs, else
    this device's, MIG slices counting theirs), the reset arguments (``dummy`` where absent) and the constexprs, block
    sizes checked spill-free by ``benchmarks/triton_aot.py``."""
    init = None if is_init is None else is_init.to(torch.int8)
    rh, rc = _last_contiguous(rh), _last_contiguous(rc)
    resets = (*_opt(init, 3, dummy), *_opt(rh, 3, dummy), *_opt(rc, 3, dummy))
    if not sms and dummy.device.type == "cuda":
        sms = torch.cuda.get_device_properties(dummy.device).multi_processor_count
    G, itemsize = 4 if lstm else 3, getattr(torch, compute_dtype).itemsize
    programs = None
    constexprs = dict(
        IS_LSTM=lstm, HAS_INIT=init is not None, HAS_RESET=rh is not None,
        ACC=tl.float64 if dummy.dtype == torch.float64 else tl.float32,  # the accumulation dtype
        CDT=getattr(tl, compute_dtype),  # the matmul operands'
        PREC=precision if compute_dtype == "float32" else "ieee",  # TF32 modes only apply to fp32 operands
        # the interpreter's bf16 tl.dot is wrong: the bf16-rounded operands multiplied in fp32 (the same products)
        UPCAST=INTERPRET and compute_dtype == "bfloat16",
    )
    if variant_for(H, G, itemsize, batch=N, ensemble=E, sms=sms) == "persistent":
        hs, programs = kernels.persistent_plan(H, G, itemsize, N, E, sms or PLAN_SMS)
        # forward: [64, 64] carry chunks, one warpgroup; backward: [64, 128] output chunks, two (one spills)
        bk, warps = (min(H, 64), 4) if direction == "fwd" else (min(H, 128), 8)
        constexprs.update(HS=hs, BK=bk, KC=H // bk, ROWS=kernels.PERSISTENT_ROWS, num_warps=warps, num_stages=1,
                          SYNC=True)
    else:
        operands = "bfloat16" if compute_dtype == "bfloat16" else precision
        warps, stages = _STREAMED_LAUNCH.get(("lstm" if lstm else "gru", direction, operands), (8, 3))
        block_t = min(kernels.TILE, max(16, triton.next_power_of_2(H)))  # tl.dot needs every dim >= 16
        constexprs.update(BLOCK_N=BLOCK_N, BLOCK_T=block_t, num_warps=warps, num_stages=stages)
    return programs, resets, constexprs


def _input_projection(x: Tensor, w_ih: Tensor, b_ih: Optional[Tensor]) -> Tensor:
    """``gx [E, N, T, G*H] = x @ W_ih^T + b_ih`` for all steps: one batched GEMM."""
    gx = torch.matmul(x, w_ih.transpose(-1, -2).unsqueeze(1))
    return gx if b_ih is None else gx + b_ih[:, None, None, :]


def _fwd_outputs(gx: Tensor, H: int, lstm: bool, save: bool) -> tuple[Tensor, Tensor, Tensor]:
    E, N, T = gx.shape[:3]
    acc = torch.float64 if gx.dtype == torch.float64 else torch.float32  # states are kept in acc dtype
    hs = gx.new_empty((E, N, T + 1, H), dtype=acc)
    cs = gx.new_empty((E, N, T + 1, H) if lstm else (E, 0), dtype=acc)
    gates = gx.new_empty((E, N, T, 4 * H) if save else (E, 0), dtype=acc)
    return hs, cs, gates


def fwd_launch(
    gx: Tensor, w: Tensor, b: Optional[Tensor], h0: Tensor, c0: Optional[Tensor], is_init: Optional[Tensor],
    rh: Optional[Tensor], rc: Optional[Tensor], hs: Tensor, cs: Tensor, gates: Tensor,
    lstm: bool, save: bool, compute_dtype: str, precision: str, sms: Optional[int] = None,
) -> tuple[Callable, tuple, tuple, dict]:
    """The forward kernel, grid, positional arguments and constexprs (``benchmarks/triton_aot.py`` compiles them;
    ``sms``: the GPU planned for), tensors with their strides (the last dim made unit-stride). The persistent path
    writes the state before step 0 itself; its last two arguments are the steps' range."""
    E, N, T = gx.shape[:3]
    H = w.shape[-1]
    w, b, h0, c0 = map(_last_contiguous, (w, b, h0, c0))
    programs, resets, constexprs = _plan("fwd", lstm, H, N, E, gx, is_init, rh, rc, compute_dtype, precision, sms)
    constexprs.update(HAS_BIAS=b is not None, SAVE=save)
    weights = (gx, *gx.stride()[:3], w, *w.stride()[:2], *_opt(b, 1, gx))
    outs = (hs, cs if lstm else hs, gates if save else hs)
    if programs:
        hs[:, :, 0] = h0
        if lstm:
            cs[:, :, 0] = c0
        carry = hs.new_empty((E, 2, N, H))
        carry[:, 0] = h0 if is_init is None else torch.where(is_init[:, :, :1], 0.0 if rh is None else rh[:, :, 0], h0)
        flags = torch.zeros(E * programs, dtype=torch.int32, device=gx.device)
        args = (*weights, *resets, *outs, carry, flags, N, T, H, 0, T)
        return kernels._rnn_fwd_persistent_kernel, (H // constexprs["HS"], programs, E), args, constexprs
    args = (*weights, h0, *h0.stride()[:2], *_opt(c0, 2, gx), *resets, *outs, N, T, H)
    return kernels._rnn_fwd_tiled_kernel, (triton.cdiv(N, BLOCK_N), E), args, constexprs


def bwd_launch(
    gates: Tensor, hs: Tensor, cs: Tensor, w: Tensor, is_init: Optional[Tensor], rh: Optional[Tensor],
    rc: Optional[Tensor], dhs: Tensor, dcs: Tensor, outs: tuple, lstm: bool, compute_dtype: str, precision: str,
    sms: Optional[int] = None,
) -> tuple[Callable, tuple, tuple, dict]:
    """The backward kernel, grid, arguments and constexprs (``gates``, ``hs``, ``cs``, ``dhs``, ``dcs``, ``outs``
    contiguous); the persistent kernels leave ``dh0``/``dc0`` without ``dhs/dcs[:, :, 0]``, which the caller adds."""
    w = _last_contiguous(w)
    dgx, dgh, dh0, dc0, drh, drc = outs
    E, N, T1, H = hs.shape
    programs, resets, constexprs = _plan("bwd", lstm, H, N, E, gates, is_init, rh, rc, compute_dtype, precision, sms)
    args = (gates, hs, cs, w, *w.stride()[:2], *resets, dhs, dcs, dgx, dgh if not lstm else dgx, dh0,
            dc0 if lstm else dh0, drh if rh is not None else dgx, drc if (rc is not None and lstm) else dgx)
    if programs:
        dh0.zero_()
        dc0.zero_()
        args += (
            hs.new_empty((E, 2, H // constexprs["HS"], N, H)),  # every slice's part of dh_prev, by step parity
            torch.zeros(E * programs, dtype=torch.int32, device=hs.device), N, T1 - 1, H, 0, T1 - 1,
        )
        constexprs.update(PHASE_A=True, PHASE_B=True)
        return kernels._rnn_bwd_persistent_kernel, (H // constexprs["HS"], programs, E), args, constexprs
    # the streamed kernel keeps GRU's direct term dh * z in a scratch row per batch entry
    args += (dh0.new_empty((E, N, H)) if not lstm else dgx, N, T1 - 1, H)
    return kernels._rnn_bwd_tiled_kernel, (triton.cdiv(N, BLOCK_N), E), args, constexprs


def _launch(run: Callable, kernel, grid: tuple, args: tuple, constexprs: dict) -> None:
    """One launch; the persistent kernels in the interpreter, which cannot spin between programs, one launch per
    step (and per phase of the backward's step), without their flag: the same step body, in order."""
    with _LAUNCH_LOCK:
        kernels.LAUNCHES["count"] += 1
        if not (INTERPRET and constexprs.get("SYNC")):
            run(kernel)[grid](*args, **constexprs)
            return
        phases = [{"PHASE_A": a, "PHASE_B": not a} for a in (True, False)] if "PHASE_A" in constexprs else [{}]
        for t in range(args[-1]):
            for phase in phases:
                run(kernel)[grid](*args[:-2], t, t + 1, **{**constexprs, "SYNC": False, **phase})


def _make_fwd(run: Optional[Callable]) -> Callable:
    """The forward op launching through ``run``; ``None``: its fake implementation (the outputs, no launch)."""

    def layer_fwd(
        x: Tensor, w_ih: Tensor, b_ih: Optional[Tensor], w: Tensor, b: Optional[Tensor], h0: Tensor,
        c0: Optional[Tensor], is_init: Optional[Tensor], rh: Optional[Tensor], rc: Optional[Tensor],
        lstm: bool, save: bool, compute_dtype: str, precision: str,
    ) -> tuple[Tensor, Tensor, Tensor]:
        E, N, T, _ = x.shape
        H = w.shape[-1]
        if run is None:
            return _fwd_outputs(x, H, lstm, save)
        if E * N * (T + 1) * 4 * H >= MAX_ELEMENTS:
            raise ValueError(f"backend 'triton': E*N*(T+1)*4*H = {E * N * (T + 1) * 4 * H} exceeds the kernels' "
                             f"32-bit indexing ({MAX_ELEMENTS}); split the batch or the sequence, or use one of "
                             "reference, scan, pad.")
        gx = _input_projection(x, w_ih, b_ih)
        hs, cs, gates = _fwd_outputs(gx, H, lstm, save)
        _launch(run, *fwd_launch(gx, w, b, h0, c0, is_init, rh, rc, hs, cs, gates, lstm, save, compute_dtype,
                                 precision))
        return hs, cs, gates

    return layer_fwd


def _bwd_outputs(gates: Tensor, hs: Tensor, lstm: bool, has_reset: bool) -> tuple:
    E, N, T1, H = hs.shape
    T, G = T1 - 1, 4 if lstm else 3
    dgx = gates.new_empty((E, N, T, G * H))
    dgh = gates.new_empty((E, N, T, H) if not lstm else (E, 0))
    dh0 = gates.new_empty((E, N, H))
    dc0 = gates.new_empty((E, N, H) if lstm else (E, 0))
    drh = gates.new_empty((E, N, T, H) if has_reset else (E, 0))
    drc = gates.new_empty((E, N, T, H) if has_reset and lstm else (E, 0))
    return dgx, dgh, dh0, dc0, drh, drc


def _make_bwd(run: Optional[Callable]) -> Callable:
    """The backward op launching through ``run``; ``None``: its fake implementation."""

    def layer_bwd(
        gates: Tensor, hs: Tensor, cs: Tensor, w: Tensor, is_init: Optional[Tensor],
        rh: Optional[Tensor], rc: Optional[Tensor], dhs: Tensor, dcs: Tensor,
        lstm: bool, compute_dtype: str, precision: str,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        outs = _bwd_outputs(gates, hs, lstm, rh is not None)
        if run is None:
            return outs
        gates, hs, dhs = gates.contiguous(), hs.contiguous(), dhs.contiguous()
        cs, dcs = (cs.contiguous(), dcs.contiguous()) if lstm else (hs, dhs)
        kernel, grid, args, constexprs = bwd_launch(gates, hs, cs, w, is_init, rh, rc, dhs, dcs, outs, lstm,
                                                     compute_dtype, precision)
        _launch(run, kernel, grid, args, constexprs)
        if "SYNC" in constexprs:  # persistent: the grads reaching the initial state directly
            outs[2].add_(dhs[:, :, 0])
            if lstm:
                outs[3].add_(dcs[:, :, 0])
        return outs

    return layer_bwd


LayerOps = NamedTuple("LayerOps", [("fwd", Callable), ("bwd", Callable)])  # the ops of one registration flavour


def _register(opaque: bool) -> LayerOps:
    suffix = "_opaque" if opaque else ""
    ops = []
    for name, make in (("fwd", _make_fwd), ("bwd", _make_bwd)):
        qualname = f"rnn_functional::triton_layer_{name}{suffix}"
        if opaque:
            op = torch.library.custom_op(qualname, mutates_args=())(make(lambda kernel: kernel))
            op.register_fake(make(None))
        else:
            op = torch.library.triton_op(qualname, mutates_args=())(make(torch.library.wrap_triton))
        torch.library.register_vmap(op, _fold_ensemble(op))
        ops.append(op)
    layer = LayerOps(*ops)
    torch.library.register_autograd(layer.fwd, _make_backward(layer), setup_context=_setup_context)
    return layer


def _setup_context(ctx, inputs, output) -> None:
    x, w_ih, b_ih, w, b, h0, c0, is_init, rh, rc, lstm, save, compute_dtype, precision = inputs
    hs, cs, gates = output
    ctx.lstm, ctx.save, ctx.compute_dtype, ctx.precision = lstm, save, compute_dtype, precision
    ctx.has_bias = b is not None
    # the dtypes of the inputs with a grad (None: no grad; GRU has no cell state)
    ctx.dtypes = tuple(None if t is None else t.dtype for t in (x, h0, c0 if lstm else None, rh, rc if lstm else None))
    # the (small) inputs replay the forward: recompute="full" (no per-step gates), a create_graph backward
    ctx.save_for_backward(x, w_ih, w, is_init, rh, rc, hs, cs, gates if save else None, b_ih, b, h0, c0)


def _weight_grad(d_out: Tensor, inp: Tensor) -> Tensor:
    """``sum over (n, t) of d_out[e, n, t, :]^T inp[e, n, t, :]`` -> ``[E, out, in]``."""
    E = d_out.shape[0]
    rows_out = d_out.reshape(E, -1, d_out.shape[-1])
    return torch.bmm(rows_out.transpose(1, 2), inp.to(d_out.dtype).reshape(E, -1, inp.shape[-1]))


def _make_backward(layer: LayerOps) -> Callable:
    def backward(ctx, dhs: Tensor, dcs: Tensor, _dgates: Tensor) -> tuple:
        x, w_ih, w, is_init, rh, rc, hs, cs, gates, b_ih, b, h0, c0 = ctx.saved_tensors
        lstm = ctx.lstm
        if torch.is_grad_enabled():  # create_graph=True: the kernels' backward has no derivative of its own, so
            # replayed_vjp of layer_ref from the saved inputs (one more forward, in plain ops), exact to every order
            def states(x, w_ih, b_ih, w, b, h0, c0, rh, rc):
                return layer_ref(x, w_ih, b_ih, w, b, h0, c0, is_init, rh, rc, lstm)[: 2 if lstm else 1]

            grads = replayed_vjp(states, (x, w_ih, b_ih, w, b, h0, c0, rh, rc), (dhs, dcs)[: 2 if lstm else 1])
            dx, dw_ih, db_ih, dw, db, dh0, dc0, drh, drc = grads
            return dx, dw_ih, db_ih, dw, db, dh0, dc0, None, drh, drc, None, None, None, None
        if not ctx.save:  # replay the forward (projection + kernel) to regenerate the gates
            _, _, gates = layer.fwd(x, w_ih, b_ih, w, b, h0, c0, is_init, rh, rc, lstm, True, ctx.compute_dtype,
                                    ctx.precision)
        dhs = torch.zeros_like(hs) if dhs is None else dhs
        dcs = torch.zeros_like(cs) if (dcs is None and lstm) else dcs
        dgx, dgh, dh0, dc0, drh, drc = layer.bwd(gates, hs, cs, w, is_init, rh, rc, dhs, dcs if lstm else dhs, lstm,
                                                  ctx.compute_dtype, ctx.precision)
        H = w.shape[-1]
        d_rec = dgx if lstm else torch.cat([dgx[..., : 2 * H], dgh], dim=-1)  # grad of h @ W_hh^T + b_hh
        h_prev = hs[:, :, :-1]  # the carry entering every step: reset to rh (or 0) where is_init
        if is_init is not None:
            fill = rh.to(h_prev.dtype) if rh is not None else h_prev.new_zeros(())
            h_prev = torch.where(is_init[..., None], fill, h_prev)
        # weight grads: GEMMs over all N * T rows
        dw_ih, dw = _weight_grad(dgx, x), _weight_grad(d_rec, h_prev)
        dx = torch.matmul(dgx, w_ih.to(dgx.dtype).unsqueeze(1))
        db_ih, db = (dgx.sum(dim=(1, 2)), d_rec.sum(dim=(1, 2))) if ctx.has_bias else (None, None)
        x_t, h0_t, c0_t, rh_t, rc_t = ctx.dtypes
        cast = lambda t, dt=x_t: None if t is None or dt is None else t.to(dt)  # noqa: E731 - params share x's dtype
        return (cast(dx), cast(dw_ih), cast(db_ih), cast(dw), cast(db), cast(dh0, h0_t), cast(dc0, c0_t), None,
                cast(drh, rh_t), cast(drc, rc_t), None, None, None, None)

    return backward


def layer_ref(x: Tensor, w_ih: Tensor, b_ih: Optional[Tensor], w: Tensor, b: Optional[Tensor], h0: Tensor,
              c0: Optional[Tensor], is_init: Optional[Tensor], rh: Optional[Tensor], rc: Optional[Tensor],
              lstm: bool) -> tuple[Tensor, Tensor]:
    """The fused layer's math in plain torch ops, differentiable to every order (a ``create_graph`` backward replays
    it): ``triton_layer_fwd``'s arguments -> ``(hs, cs)`` as it returns them, in the accumulation dtype."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    x, w_ih, b_ih, w, b, h, c, rh, rc = (None if t is None else t.to(acc) for t in (x, w_ih, b_ih, w, b, h0, c0, rh, rc))
    gx = _input_projection(x, w_ih, b_ih)  # [E, N, T, G*H]
    hs, cs = [h], [c]
    steps = x.shape[2]  # per-step views by one unbind each, not [:, :, t]: see backends/reference.py
    gx_t = gx.unbind(2)
    m_t, rh_t, rc_t = ((None,) * steps if t is None else t.unbind(2) for t in (is_init, rh, rc))
    for t in range(steps):
        if is_init is not None:
            m = m_t[t][:, :, None]
            h = torch.where(m, 0.0 if rh is None else rh_t[t], h)
            c = torch.where(m, 0.0 if rc is None else rc_t[t], c) if lstm else c
        gh = torch.matmul(h, w.transpose(-1, -2)) + (0.0 if b is None else b[:, None, :])
        if lstm:
            i, f, g, o = (gx_t[t] + gh).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            (xr, xz, xn), (ar, az, an) = gx_t[t].chunk(3, -1), gh.chunk(3, -1)
            r, z = torch.sigmoid(xr + ar), torch.sigmoid(xz + az)
            n = torch.tanh(xn + r * an)
            h = n + z * (h - n)
        hs.append(h)
        cs.append(c)
    return torch.stack(hs, 2), (torch.stack(cs, 2) if lstm else hs[0].new_empty((hs[0].shape[0], 0)))


def _fold_ensemble(op: Callable) -> Callable:
    """vmap rule: move the vmapped dim next to ``E`` and merge them (``[B, E, ...] -> [B*E, ...]``)."""

    def rule(info, in_dims, *args):
        B = info.batch_size
        folded = []
        for a, d in zip(args, in_dims):
            if isinstance(a, Tensor):
                a = a.unsqueeze(0).expand(B, *a.shape) if d is None else a.movedim(d, 0)
                a = a.reshape(B * a.shape[1], *a.shape[2:])
            folded.append(a)
        outs = op(*folded)
        return tuple(o.reshape(B, o.shape[0] // B, *o.shape[1:]) for o in outs), (0,) * len(outs)

    return rule


OPAQUE_OPS = _register(opaque=True)
TRITON_OPS = _register(opaque=False)


def layer_ops(device: torch.device) -> LayerOps:
    """The registered ops for ``device``: ``triton_op`` on CUDA, opaque custom ops in interpreter mode."""
    return TRITON_OPS if device.type == "cuda" and not INTERPRET else OPAQUE_OPS
