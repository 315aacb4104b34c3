"""Triton kernels of one LSTM/GRU layer over a whole sequence (forward and backward), one launch for all ``T``
steps: persistent and streamed variants (docs/backends.md, "Triton kernels") sharing each cell's gate math. The state
is kept in the accumulation dtype (fp32, or fp64 for fp64 params); ``gx = x @ W_ih^T + b_ih`` comes precomputed.

Layouts (a leading ensemble dim ``E``, stride 0 where shared): ``gx [E, N, T, G*H]``, ``w [E, G*H, H]``,
``b [E, G*H]``, ``h0/c0 [E, N, H]``, ``is_init [E, N, T]`` (int8), ``rh/rc [E, N, T, H]`` (reset states),
``hs/cs [E, N, T+1, H]`` (state before step 0 and after every step),
``gates [E, N, T, 4*H]`` (saved activations: LSTM ``i, f, g, o``; GRU ``r, z, n, W_hn h + b_hn``).
"""

from __future__ import annotations

import triton
import triton.language as tl

LAUNCHES = {"count": 0}  # kernel launches so far (forward and backward), read by the tests


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def _operand(x, CDT: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr):
    """``x`` rounded to the matmul operand dtype ``CDT``; with ``UPCAST`` held in ``ACC`` (same products)."""
    if UPCAST:
        return x.to(CDT).to(ACC)
    return x.to(CDT)


@triton.jit
def _init_tile(init_ptr, s_i_e, s_i_n, s_i_t, e, rows, rmask, t, HAS_INIT: tl.constexpr, BLOCK_N: tl.constexpr):
    """``is_init`` of ``rows`` at step ``t`` as a ``[BLOCK_N, 1]`` mask (all false without ``HAS_INIT``)."""
    if HAS_INIT:
        init = tl.load(init_ptr + e * s_i_e + rows * s_i_n + t * s_i_t, mask=rmask, other=0) != 0
    else:
        init = tl.zeros((BLOCK_N,), dtype=tl.int1)
    return init[:, None]


@triton.jit
def _reset(v, r_ptr, mask, init2, HAS_RESET: tl.constexpr, ACC: tl.constexpr):
    """The carry ``v`` entering a step, replaced by the reset state (or 0) where ``init2``."""
    if HAS_RESET:
        return tl.where(init2, tl.load(r_ptr, mask=mask, other=0.0).to(ACC), v)
    return tl.where(init2, 0.0, v)


@triton.jit
def _carry_in(st_ptr, r_ptr, mask, init2, HAS_INIT: tl.constexpr, HAS_RESET: tl.constexpr, ACC: tl.constexpr):
    """A tile of the carry entering a step: stored state, replaced by the reset value (or 0) where ``init2``."""
    v = tl.load(st_ptr, mask=mask, other=0.0).to(ACC)
    if HAS_INIT:
        v = _reset(v, r_ptr, mask, init2, HAS_RESET, ACC)
    return v


@triton.jit
def _reset_grad(d, dr_ptr, mask, init2, HAS_RESET: tl.constexpr):
    """The carry grad ``d`` leaving a step backwards: where ``init2`` it goes to the reset state
    (stored at ``dr_ptr`` with ``HAS_RESET``) instead of the previous step."""
    if HAS_RESET:
        tl.store(dr_ptr, tl.where(init2, d, 0.0), mask=mask)
    return tl.where(init2, 0.0, d)


# Gate math of one step on a tile, shared by both variants. ``a_k``: recurrent pre-activations ``h W_k^T + b_k``;
# ``x_k``: the input projection's; ``q_k``: the saved activations.


@triton.jit
def _load_gates(ptr, H, mask, ACC: tl.constexpr):
    """The four gate tiles of a row whose gates are ``H`` apart."""
    q0 = tl.load(ptr, mask=mask, other=0.0).to(ACC)
    q1 = tl.load(ptr + H, mask=mask, other=0.0).to(ACC)
    q2 = tl.load(ptr + 2 * H, mask=mask, other=0.0).to(ACC)
    q3 = tl.load(ptr + 3 * H, mask=mask, other=0.0).to(ACC)
    return q0, q1, q2, q3


@triton.jit
def _store_gates(ptr, H, mask, q0, q1, q2, q3):
    tl.store(ptr, q0, mask=mask)
    tl.store(ptr + H, q1, mask=mask)
    tl.store(ptr + 2 * H, q2, mask=mask)
    tl.store(ptr + 3 * H, q3, mask=mask)


@triton.jit
def _lstm_fwd_gates(a0, a1, a2, a3, x0, x1, x2, x3, c):
    """The activations ``i, f, g, o`` and ``(c, h)`` after the step from ``c`` before it."""
    gi = _sigmoid(a0 + x0)
    gf = _sigmoid(a1 + x1)
    gg = _tanh(a2 + x2)
    go = _sigmoid(a3 + x3)
    c = gf * c + gi * gg
    return gi, gf, gg, go, c, go * _tanh(c)


@triton.jit
def _gru_fwd_gates(a0, a1, a2, x0, x1, x2, h):
    """The activations ``r, z, n`` and ``h`` after the step from ``h`` before it."""
    gr = _sigmoid(x0 + a0)
    gz = _sigmoid(x1 + a1)
    gn = _tanh(x2 + gr * a2)
    return gr, gz, gn, gn + gz * (h - gn)


@triton.jit
def _lstm_bwd_gates(dh, dc, c_t, c_prev, q0, q1, q2, q3):
    """From the grads ``dh, dc`` of the step's outputs ``h, c_t``: the pre-activation grads
    ``da0..da3`` and the grad of ``c_prev`` (through ``f``)."""
    tc = _tanh(c_t)
    dc += dh * q3 * (1.0 - tc * tc)
    da0 = dc * q2 * q0 * (1.0 - q0)
    da1 = dc * c_prev * q1 * (1.0 - q1)
    da2 = dc * q0 * (1.0 - q2 * q2)
    da3 = dh * tc * q3 * (1.0 - q3)
    return da0, da1, da2, da3, dc * q1


@triton.jit
def _gru_bwd_gates(dh, h_prev, q0, q1, q2, q3):
    """From the grad ``dh`` of the step's output: the pre-activation grads ``da0..da2``, the grad
    ``dhn`` of ``W_hn h_prev + b_hn`` and the direct grad ``dh * z`` of ``h_prev``."""
    da2 = dh * (1.0 - q1) * (1.0 - q2 * q2)
    da1 = dh * (h_prev - q2) * q1 * (1.0 - q1)
    dhn = da2 * q0
    return da2 * q3 * q0 * (1.0 - q0), da1, da2, dhn, dh * q1


# Streamed (any H): one program per ``BLOCK_N`` rows, the state in the output buffers, weight tiles streamed per
# step; each step ends with a barrier so the next step's tiles read the state the other threads wrote.

TILE = 32  # tile width of the streamed kernels (wider spills: benchmarks/triton_aot.py)


@triton.jit
def _w_dot(a, w_base, sw, g, H, ka, jb, TRANSPOSE: tl.constexpr, CDT: tl.constexpr, ACC: tl.constexpr,
           UPCAST: tl.constexpr, PREC: tl.constexpr):
    """``a`` times the tile of gate ``g``: transposed ``[k, j] = w[g*H + j, k]`` (ka = k, jb = j) or
    ``[j, k] = w[g*H + j, k]``."""
    if TRANSPOSE:
        ptr = w_base + (g * H + jb[None, :]) * sw + ka[:, None]
    else:
        ptr = w_base + (g * H + ka[:, None]) * sw + jb[None, :]
    tile = _operand(tl.load(ptr, mask=(ka[:, None] < H) & (jb[None, :] < H), other=0.0), CDT, ACC, UPCAST)
    return tl.dot(a, tile, input_precision=PREC, out_dtype=ACC)


@triton.jit
def _rnn_fwd_tiled_kernel(
    gx_ptr, s_gx_e, s_gx_n, s_gx_t,
    w_ptr, s_w_e, s_w_r,
    b_ptr, s_b_e,
    h0_ptr, s_h0_e, s_h0_n,
    c0_ptr, s_c0_e, s_c0_n,
    init_ptr, s_i_e, s_i_n, s_i_t,
    rh_ptr, s_rh_e, s_rh_n, s_rh_t,
    rc_ptr, s_rc_e, s_rc_n, s_rc_t,
    hs_ptr, cs_ptr, gates_ptr,
    N, T, H,
    IS_LSTM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_INIT: tl.constexpr, HAS_RESET: tl.constexpr,
    SAVE: tl.constexpr, CDT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """One layer's time loop over ``BLOCK_N`` rows per program (grid ``(cdiv(N, BLOCK_N), E)``), ``BLOCK_T``-wide
    tiles of H streamed per step: writes ``hs``, ``cs`` and (``SAVE``) the gates."""
    pid_n = tl.program_id(0)
    e = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    r2 = rows[:, None]
    T1 = T + 1
    hs_row = hs_ptr + (e * N + r2) * T1 * H
    cs_row = cs_ptr + (e * N + r2) * T1 * H
    g_row = gates_ptr + (e * N + r2) * T * 4 * H
    gx_row = gx_ptr + e * s_gx_e + r2 * s_gx_n
    rh_row = rh_ptr + e * s_rh_e + r2 * s_rh_n
    rc_row = rc_ptr + e * s_rc_e + r2 * s_rc_n
    w_base = w_ptr + e * s_w_e
    b_base = b_ptr + e * s_b_e

    for j0 in range(0, H, BLOCK_T):
        cj = j0 + tl.arange(0, BLOCK_T)
        m = rmask[:, None] & (cj < H)[None, :]
        h = tl.load(h0_ptr + e * s_h0_e + r2 * s_h0_n + cj[None, :], mask=m, other=0.0)
        tl.store(hs_row + cj[None, :], h.to(hs_ptr.dtype.element_ty), mask=m)
        if IS_LSTM:
            c = tl.load(c0_ptr + e * s_c0_e + r2 * s_c0_n + cj[None, :], mask=m, other=0.0)
            tl.store(cs_row + cj[None, :], c.to(cs_ptr.dtype.element_ty), mask=m)
    tl.debug_barrier()

    for t in range(T):
        init2 = _init_tile(init_ptr, s_i_e, s_i_n, s_i_t, e, rows, rmask, t, HAS_INIT, BLOCK_N)
        for j0 in range(0, H, BLOCK_T):
            cj = j0 + tl.arange(0, BLOCK_T)
            c2 = cj[None, :]
            m = rmask[:, None] & (cj < H)[None, :]
            a0 = tl.zeros((BLOCK_N, BLOCK_T), dtype=ACC)
            a1 = tl.zeros((BLOCK_N, BLOCK_T), dtype=ACC)
            a2 = tl.zeros((BLOCK_N, BLOCK_T), dtype=ACC)
            a3 = tl.zeros((BLOCK_N, BLOCK_T), dtype=ACC)
            for k0 in range(0, H, BLOCK_T):
                ck = k0 + tl.arange(0, BLOCK_T)
                mk = rmask[:, None] & (ck < H)[None, :]
                hk = _carry_in(hs_row + t * H + ck[None, :], rh_row + t * s_rh_t + ck[None, :], mk, init2,
                               HAS_INIT, HAS_RESET, ACC)
                hk = _operand(hk, CDT, ACC, UPCAST)
                a0 += _w_dot(hk, w_base, s_w_r, 0, H, ck, cj, True, CDT, ACC, UPCAST, PREC)
                a1 += _w_dot(hk, w_base, s_w_r, 1, H, ck, cj, True, CDT, ACC, UPCAST, PREC)
                a2 += _w_dot(hk, w_base, s_w_r, 2, H, ck, cj, True, CDT, ACC, UPCAST, PREC)
                if IS_LSTM:
                    a3 += _w_dot(hk, w_base, s_w_r, 3, H, ck, cj, True, CDT, ACC, UPCAST, PREC)
            if HAS_BIAS:
                a0 += tl.load(b_base + cj, mask=cj < H, other=0.0).to(ACC)[None, :]
                a1 += tl.load(b_base + H + cj, mask=cj < H, other=0.0).to(ACC)[None, :]
                a2 += tl.load(b_base + 2 * H + cj, mask=cj < H, other=0.0).to(ACC)[None, :]
                if IS_LSTM:
                    a3 += tl.load(b_base + 3 * H + cj, mask=cj < H, other=0.0).to(ACC)[None, :]
            gx_t = gx_row + t * s_gx_t + c2
            x0 = tl.load(gx_t, mask=m, other=0.0).to(ACC)
            x1 = tl.load(gx_t + H, mask=m, other=0.0).to(ACC)
            x2 = tl.load(gx_t + 2 * H, mask=m, other=0.0).to(ACC)
            g_t = g_row + t * 4 * H + c2
            if IS_LSTM:
                x3 = tl.load(gx_t + 3 * H, mask=m, other=0.0).to(ACC)
                c = _carry_in(cs_row + t * H + c2, rc_row + t * s_rc_t + c2, m, init2, HAS_INIT, HAS_RESET, ACC)
                gi, gf, gg, go, c, h = _lstm_fwd_gates(a0, a1, a2, a3, x0, x1, x2, x3, c)
                tl.store(cs_row + (t + 1) * H + c2, c.to(cs_ptr.dtype.element_ty), mask=m)
                if SAVE:
                    _store_gates(g_t, H, m, gi, gf, gg, go)
            else:
                h = _carry_in(hs_row + t * H + c2, rh_row + t * s_rh_t + c2, m, init2, HAS_INIT, HAS_RESET, ACC)
                gr, gz, gn, h = _gru_fwd_gates(a0, a1, a2, x0, x1, x2, h)
                if SAVE:
                    _store_gates(g_t, H, m, gr, gz, gn, a2)
            tl.store(hs_row + (t + 1) * H + c2, h.to(hs_ptr.dtype.element_ty), mask=m)
        tl.debug_barrier()


@triton.jit
def _rnn_bwd_tiled_kernel(
    gates_ptr, hs_ptr, cs_ptr,
    w_ptr, s_w_e, s_w_r,
    init_ptr, s_i_e, s_i_n, s_i_t,
    rh_ptr, s_rh_e, s_rh_n, s_rh_t,
    rc_ptr, s_rc_e, s_rc_n, s_rc_t,
    dhs_ptr, dcs_ptr,
    dgx_ptr, dgh_ptr, dh0_ptr, dc0_ptr, drh_ptr, drc_ptr, tmp_ptr,
    N, T, H,
    IS_LSTM: tl.constexpr, HAS_INIT: tl.constexpr, HAS_RESET: tl.constexpr,
    CDT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """Reverse time loop: writes ``dgx [E, N, T, G*H]``, for GRU ``dgh [E, N, T, H]`` (grad of
    ``W_hn h + b_hn``), ``dh0/dc0 [E, N, H]`` (the carry grads during the loop) and, with reset states, ``drh/drc``;
    ``tmp [E, N, H]`` holds GRU's direct term ``dh * z``. Per step: phase A the gate grads tile by tile, phase B
    ``dh_prev = sum_g da_g @ W_g``."""
    pid_n = tl.program_id(0)
    e = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    r2 = rows[:, None]
    T1 = T + 1
    G = 4 if IS_LSTM else 3
    hs_row = hs_ptr + (e * N + r2) * T1 * H
    cs_row = cs_ptr + (e * N + r2) * T1 * H
    dhs_row = dhs_ptr + (e * N + r2) * T1 * H
    dcs_row = dcs_ptr + (e * N + r2) * T1 * H
    g_row = gates_ptr + (e * N + r2) * T * 4 * H
    dgx_row = dgx_ptr + (e * N + r2) * T * G * H
    dgh_row = dgh_ptr + (e * N + r2) * T * H
    drh_row = drh_ptr + (e * N + r2) * T * H
    drc_row = drc_ptr + (e * N + r2) * T * H
    rh_row = rh_ptr + e * s_rh_e + r2 * s_rh_n
    rc_row = rc_ptr + e * s_rc_e + r2 * s_rc_n
    dh_row = dh0_ptr + (e * N + r2) * H
    dc_row = dc0_ptr + (e * N + r2) * H
    tmp_row = tmp_ptr + (e * N + r2) * H
    w_base = w_ptr + e * s_w_e

    for j0 in range(0, H, BLOCK_T):
        cj = j0 + tl.arange(0, BLOCK_T)
        m = rmask[:, None] & (cj < H)[None, :]
        zero = tl.zeros((BLOCK_N, BLOCK_T), dtype=ACC)
        tl.store(dh_row + cj[None, :], zero, mask=m)
        if IS_LSTM:
            tl.store(dc_row + cj[None, :], zero, mask=m)
    tl.debug_barrier()

    for tt in range(T):
        t = T - 1 - tt
        init2 = _init_tile(init_ptr, s_i_e, s_i_n, s_i_t, e, rows, rmask, t, HAS_INIT, BLOCK_N)
        # phase A: gate grads, elementwise per tile
        for j0 in range(0, H, BLOCK_T):
            cj = j0 + tl.arange(0, BLOCK_T)
            c2 = cj[None, :]
            m = rmask[:, None] & (cj < H)[None, :]
            dh = tl.load(dh_row + c2, mask=m, other=0.0) + tl.load(dhs_row + (t + 1) * H + c2, mask=m, other=0.0).to(ACC)
            q0, q1, q2, q3 = _load_gates(g_row + t * 4 * H + c2, H, m, ACC)
            dgx_t = dgx_row + t * G * H + c2
            if IS_LSTM:
                dc = tl.load(dc_row + c2, mask=m, other=0.0) + tl.load(dcs_row + (t + 1) * H + c2, mask=m, other=0.0).to(ACC)
                c_t = tl.load(cs_row + (t + 1) * H + c2, mask=m, other=0.0).to(ACC)
                c_prev = _carry_in(cs_row + t * H + c2, rc_row + t * s_rc_t + c2, m, init2, HAS_INIT, HAS_RESET, ACC)
                da0, da1, da2, da3, dc = _lstm_bwd_gates(dh, dc, c_t, c_prev, q0, q1, q2, q3)
                _store_gates(dgx_t, H, m, da0, da1, da2, da3)
                if HAS_INIT:
                    dc = _reset_grad(dc, drc_row + t * H + c2, m, init2, HAS_RESET)
                tl.store(dc_row + c2, dc, mask=m)
            else:
                h_prev = _carry_in(hs_row + t * H + c2, rh_row + t * s_rh_t + c2, m, init2, HAS_INIT, HAS_RESET, ACC)
                da0, da1, da2, dhn, dz = _gru_bwd_gates(dh, h_prev, q0, q1, q2, q3)
                tl.store(dgx_t, da0, mask=m)
                tl.store(dgx_t + H, da1, mask=m)
                tl.store(dgx_t + 2 * H, da2, mask=m)
                tl.store(dgh_row + t * H + c2, dhn, mask=m)
                tl.store(tmp_row + c2, dz, mask=m)
        tl.debug_barrier()
        # phase B: dh_prev = sum_g da_g @ W_g, tile by tile, then the reset
        for k0 in range(0, H, BLOCK_T):
            ck = k0 + tl.arange(0, BLOCK_T)
            mk = rmask[:, None] & (ck < H)[None, :]
            if IS_LSTM:
                acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=ACC)
            else:
                acc = tl.load(tmp_row + ck[None, :], mask=mk, other=0.0)
            for j0 in range(0, H, BLOCK_T):
                cj = j0 + tl.arange(0, BLOCK_T)
                m = rmask[:, None] & (cj < H)[None, :]
                dgx_t = dgx_row + t * G * H + cj[None, :]
                da = _operand(tl.load(dgx_t, mask=m, other=0.0), CDT, ACC, UPCAST)
                acc += _w_dot(da, w_base, s_w_r, 0, H, cj, ck, False, CDT, ACC, UPCAST, PREC)
                da = _operand(tl.load(dgx_t + H, mask=m, other=0.0), CDT, ACC, UPCAST)
                acc += _w_dot(da, w_base, s_w_r, 1, H, cj, ck, False, CDT, ACC, UPCAST, PREC)
                # GRU's third product is with the grad of W_hn h + b_hn, not of the input projection
                if IS_LSTM:
                    da = _operand(tl.load(dgx_t + 2 * H, mask=m, other=0.0), CDT, ACC, UPCAST)
                else:
                    da = _operand(tl.load(dgh_row + t * H + cj[None, :], mask=m, other=0.0), CDT, ACC, UPCAST)
                acc += _w_dot(da, w_base, s_w_r, 2, H, cj, ck, False, CDT, ACC, UPCAST, PREC)
                if IS_LSTM:
                    da = _operand(tl.load(dgx_t + 3 * H, mask=m, other=0.0), CDT, ACC, UPCAST)
                    acc += _w_dot(da, w_base, s_w_r, 3, H, cj, ck, False, CDT, ACC, UPCAST, PREC)
            if HAS_INIT:
                acc = _reset_grad(acc, drh_row + t * H + ck[None, :], mk, init2, HAS_RESET)
            tl.store(dh_row + ck[None, :], acc, mask=mk)
        tl.debug_barrier()

    for j0 in range(0, H, BLOCK_T):
        cj = j0 + tl.arange(0, BLOCK_T)
        m = rmask[:, None] & (cj < H)[None, :]
        dh = tl.load(dh_row + cj[None, :], mask=m, other=0.0) + tl.load(dhs_row + cj[None, :], mask=m, other=0.0).to(ACC)
        tl.store(dh_row + cj[None, :], dh, mask=m)
        if IS_LSTM:
            dc = tl.load(dc_row + cj[None, :], mask=m, other=0.0) + tl.load(dcs_row + cj[None, :], mask=m, other=0.0).to(ACC)
            tl.store(dc_row + cj[None, :], dc, mask=m)


# Persistent (all SMs, co-resident). Grid ``(S, P, E)``: program ``(s, p, e)`` owns the ``HS = H / S`` hidden units
# ``[s*HS, (s+1)*HS)`` of every gate and the 64-row groups ``p, p + P, ...`` of member ``e``; its slice of ``W_hh``
# stays on chip in ``KC`` chunks of ``BK`` rows (a tuple indexed statically). The carry entering a step lives in a
# ping-pong buffer ``carry [E, 2, N, H]``. ``SYNC=False``: no flag, one step per launch (the interpreter cannot spin).

PERSISTENT_ROWS = 64  # batch rows per group: the M of one wgmma
PERSISTENT_BYTES = 128 * 1024  # budget for one program's slice of the recurrent weights


def persistent_plan(hidden: int, gates: int, itemsize: int, batch: int, ensemble: int, sms: int) -> tuple | None:
    """``(HS, P)``: the slice width (as narrow as the SMs allow, down to 16 units, within the shared-memory budget)
    and row-group programs of the persistent kernels, or ``None`` where they cannot serve (width not a power of two
    in [16, 1024], slice over budget, grid beyond ``sms`` programs)."""
    if hidden < 16 or hidden > 1024 or hidden & (hidden - 1):
        return None
    groups = max(1, -(-batch // PERSISTENT_ROWS))
    least = 1  # the fewest slices whose weights fit, at most hidden // 16 (16 units each, the narrowest tl.dot)
    while gates * hidden * (hidden // least) * itemsize > PERSISTENT_BYTES:
        least *= 2
    if least > hidden // 16:
        return None
    share = max(1, sms // (ensemble * groups))
    slices = max(least, min(hidden // 16, 1 << (share.bit_length() - 1)))
    programs = min(groups, sms // (ensemble * slices))
    return (hidden // slices, programs) if programs >= 1 else None


@triton.jit
def _grid_barrier(flag, target):
    """Wait until ``target`` arrivals at ``flag``, this program's included: every store before it is visible to
    every program after it (CTA barrier, then one thread's release increment and acquire spin)."""
    tl.debug_barrier()
    tl.atomic_add(flag, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _fused_weights(w_base, sw, H, s, HS: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, G: tl.constexpr,
                   CDT: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr):
    """This program's forward weights, gate-fused: ``KC`` chunks ``[BK, 4*HS]``, ``[k, g*HS + j] = w[g*H + s*HS + j,
    kc*BK + k]`` (GRU's fourth block zero). One product per chunk: ptxas keeps one wgmma descriptor per chunk and
    k-step, not one per gate (separate gates spilled them)."""
    rk = tl.arange(0, BK)[:, None]
    col = tl.arange(0, 4 * HS)[None, :]
    g = col // HS
    rows = g * H + s * HS + col % HS
    ws = ()
    for kc in tl.static_range(KC):
        w = tl.load(w_base + rows * sw + kc * BK + rk, mask=(g < G) & (rk < BK), other=0.0)
        ws = ws + (_operand(w, CDT, ACC, UPCAST),)
    return ws


@triton.jit
def _split_gates(acc, ROWS: tl.constexpr, HS: tl.constexpr):
    """The four ``[ROWS, HS]`` gate blocks of a gate-fused tile ``[ROWS, 4*HS]`` (columns ``g*HS + j``)."""
    x = tl.permute(tl.reshape(acc, (ROWS, 2, 2, HS)), (0, 3, 1, 2))  # [r, j, a, b]: gate 2a + b
    lo, hi = tl.split(x)
    a0, a2 = tl.split(lo)
    a1, a3 = tl.split(hi)
    return a0, a1, a2, a3


@triton.jit
def _join_gates(a0, a1, a2, a3, ROWS: tl.constexpr, HS: tl.constexpr):
    """The gate-fused tile ``[ROWS, 4*HS]`` (columns ``g*HS + j``) of four ``[ROWS, HS]`` blocks."""
    x = tl.join(tl.join(a0, a2), tl.join(a1, a3))  # [r, j, a, b]: gate 2a + b
    return tl.reshape(tl.permute(x, (0, 2, 3, 1)), (ROWS, 4 * HS))


@triton.jit
def _rnn_fwd_persistent_kernel(
    gx_ptr, s_gx_e, s_gx_n, s_gx_t,
    w_ptr, s_w_e, s_w_r,
    b_ptr, s_b_e,
    init_ptr, s_i_e, s_i_n, s_i_t,
    rh_ptr, s_rh_e, s_rh_n, s_rh_t,
    rc_ptr, s_rc_e, s_rc_n, s_rc_t,
    hs_ptr, cs_ptr, gates_ptr, carry_ptr, flag_ptr,
    N, T, H, t_begin, t_end,
    IS_LSTM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_INIT: tl.constexpr, HAS_RESET: tl.constexpr,
    SAVE: tl.constexpr, CDT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    HS: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, ROWS: tl.constexpr, SYNC: tl.constexpr,
):
    """Steps ``t_begin <= t < t_end`` of ``_rnn_fwd_tiled_kernel``'s contract; ``hs/cs[:, :, 0]`` and ``carry[:, 0]``
    (the reset carry entering step 0) are written by the launcher."""
    s = tl.program_id(0)
    pg = tl.program_id(1)
    e = tl.program_id(2)
    S = tl.num_programs(0)
    P = tl.num_programs(1)
    G: tl.constexpr = 4 if IS_LSTM else 3
    ws = _fused_weights(w_ptr + e * s_w_e, s_w_r, H, s, HS, BK, KC, G, CDT, ACC, UPCAST)
    j = s * HS + tl.arange(0, HS)
    c2 = j[None, :]
    if HAS_BIAS:
        b_base = b_ptr + e * s_b_e
        b0 = tl.load(b_base + j).to(ACC)[None, :]
        b1 = tl.load(b_base + H + j).to(ACC)[None, :]
        b2 = tl.load(b_base + 2 * H + j).to(ACC)[None, :]
        if IS_LSTM:
            b3 = tl.load(b_base + 3 * H + j).to(ACC)[None, :]
    kcol = tl.arange(0, BK)[None, :]
    T1 = T + 1
    flag = flag_ptr + e * P + pg
    for t in range(t_begin, t_end):
        src = carry_ptr + (e * 2 + t % 2) * N * H
        dst = carry_ptr + (e * 2 + (t + 1) % 2) * N * H
        for grp in range(pg, tl.cdiv(N, ROWS), P):
            rows = grp * ROWS + tl.arange(0, ROWS)
            rmask = rows < N
            r2 = rows[:, None]
            m2 = rmask[:, None] & (c2 < H)
            acc = tl.zeros((ROWS, 4 * HS), dtype=ACC)
            for kc in tl.static_range(KC):
                # the whole carry, written by all slices: read past L1, which the flag does not order
                hk = tl.load(src + r2 * H + kc * BK + kcol, mask=rmask[:, None], other=0.0, cache_modifier=".cg")
                acc = tl.dot(_operand(hk, CDT, ACC, UPCAST), ws[kc], acc, input_precision=PREC, out_dtype=ACC)
            a0, a1, a2, a3 = _split_gates(acc, ROWS, HS)
            if HAS_BIAS:
                a0 += b0
                a1 += b1
                a2 += b2
                if IS_LSTM:
                    a3 += b3
            gx_t = gx_ptr + e * s_gx_e + r2 * s_gx_n + t * s_gx_t + c2
            x0 = tl.load(gx_t, mask=m2, other=0.0).to(ACC)
            x1 = tl.load(gx_t + H, mask=m2, other=0.0).to(ACC)
            x2 = tl.load(gx_t + 2 * H, mask=m2, other=0.0).to(ACC)
            hs_row = hs_ptr + (e * N + r2) * T1 * H + c2
            g_t = gates_ptr + ((e * N + r2) * T + t) * 4 * H + c2
            if IS_LSTM:
                x3 = tl.load(gx_t + 3 * H, mask=m2, other=0.0).to(ACC)
                cs_row = cs_ptr + (e * N + r2) * T1 * H + c2
                init2 = _init_tile(init_ptr, s_i_e, s_i_n, s_i_t, e, rows, rmask, t, HAS_INIT, ROWS)
                c = _carry_in(cs_row + t * H, rc_ptr + e * s_rc_e + r2 * s_rc_n + t * s_rc_t + c2, m2, init2,
                              HAS_INIT, HAS_RESET, ACC)
                gi, gf, gg, go, c, h = _lstm_fwd_gates(a0, a1, a2, a3, x0, x1, x2, x3, c)
                tl.store(cs_row + (t + 1) * H, c.to(cs_ptr.dtype.element_ty), mask=m2)
                if SAVE:
                    _store_gates(g_t, H, m2, gi, gf, gg, go)
            else:
                h = tl.load(src + r2 * H + c2, mask=m2, other=0.0)
                gr, gz, gn, h = _gru_fwd_gates(a0, a1, a2, x0, x1, x2, h)
                if SAVE:
                    _store_gates(g_t, H, m2, gr, gz, gn, a2)
            tl.store(hs_row + (t + 1) * H, h.to(hs_ptr.dtype.element_ty), mask=m2)
            # the carry entering step t + 1, reset in registers by the only program that writes this slice
            more = rmask & (rows * 0 + t + 1 < T)
            mn = more[:, None] & (c2 < H)
            if HAS_INIT:
                init_n = _init_tile(init_ptr, s_i_e, s_i_n, s_i_t, e, rows, more, t + 1, HAS_INIT, ROWS)
                h = _reset(h, rh_ptr + e * s_rh_e + r2 * s_rh_n + (t + 1) * s_rh_t + c2, mn, init_n, HAS_RESET, ACC)
            tl.store(dst + r2 * H + c2, h, mask=mn)
        if SYNC:
            _grid_barrier(flag, (t - t_begin + 1) * S)


@triton.jit
def _rnn_bwd_persistent_kernel(
    gates_ptr, hs_ptr, cs_ptr,
    w_ptr, s_w_e, s_w_r,
    init_ptr, s_i_e, s_i_n, s_i_t,
    rh_ptr, s_rh_e, s_rh_n, s_rh_t,
    rc_ptr, s_rc_e, s_rc_n, s_rc_t,
    dhs_ptr, dcs_ptr,
    dgx_ptr, dgh_ptr, dh_ptr, dc_ptr, drh_ptr, drc_ptr, part_ptr, flag_ptr,
    N, T, H, t_begin, t_end,
    IS_LSTM: tl.constexpr, HAS_INIT: tl.constexpr, HAS_RESET: tl.constexpr,
    CDT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    HS: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, ROWS: tl.constexpr, SYNC: tl.constexpr,
    PHASE_A: tl.constexpr, PHASE_B: tl.constexpr,
):
    """Reverse steps ``T-1-t_begin`` down to ``T-t_end`` of ``_rnn_bwd_tiled_kernel``'s contract, on the forward's
    slices. Phase A: this slice's gate grads (GRU: ``dgh``, and ``dh * z`` in ``dh``) times its rows of ``W_hh``: its
    part of every column of ``dh_prev``, into ``part [E, 2, S, N, H]`` (by step parity: a fast program cannot
    overwrite what a slow one reads). Flag. Phase B: this slice's columns of ``dh_prev``, the ``S`` parts summed in
    a fixed order (deterministic), reset, into ``dh``. The launcher adds ``dhs/dcs[:, :, 0]`` after the last step."""
    s = tl.program_id(0)
    pg = tl.program_id(1)
    e = tl.program_id(2)
    S = tl.num_programs(0)
    P = tl.num_programs(1)
    G: tl.constexpr = 4 if IS_LSTM else 3
    # this slice's gate rows of W_hh in KC column chunks [4*HS, BK]: [g*HS + j, n] = w[g*H + s*HS + j, kc*BK + n]
    rg = tl.arange(0, 4 * HS)[:, None]
    gate = rg // HS
    ncol = tl.arange(0, BK)[None, :]
    ws = ()
    for kc in tl.static_range(KC):
        w = tl.load(w_ptr + e * s_w_e + (gate * H + s * HS + rg % HS) * s_w_r + kc * BK + ncol,
                    mask=(gate < G) & (ncol < BK), other=0.0)
        ws = ws + (_operand(w, CDT, ACC, UPCAST),)
    c2 = (s * HS + tl.arange(0, HS))[None, :]
    T1 = T + 1
    flag = flag_ptr + e * P + pg
    for tt in range(t_begin, t_end):
        t = T - 1 - tt
        part = part_ptr + (e * 2 + t % 2) * S * N * H
        if PHASE_A:
            for grp in range(pg, tl.cdiv(N, ROWS), P):
                rows = grp * ROWS + tl.arange(0, ROWS)
                rmask = rows < N
                r2 = rows[:, None]
                m2 = rmask[:, None] & (c2 < H)
                init2 = _init_tile(init_ptr, s_i_e, s_i_n, s_i_t, e, rows, rmask, t, HAS_INIT, ROWS)
                row = (e * N + r2) * T1 * H + c2
                dh = tl.load(dh_ptr + (e * N + r2) * H + c2, mask=m2, other=0.0)
                dh += tl.load(dhs_ptr + row + (t + 1) * H, mask=m2, other=0.0).to(ACC)
                q0, q1, q2, q3 = _load_gates(gates_ptr + ((e * N + r2) * T + t) * 4 * H + c2, H, m2, ACC)
                dgx_t = dgx_ptr + ((e * N + r2) * T + t) * G * H + c2
                if IS_LSTM:
                    dc = tl.load(dc_ptr + (e * N + r2) * H + c2, mask=m2, other=0.0)
                    dc += tl.load(dcs_ptr + row + (t + 1) * H, mask=m2, other=0.0).to(ACC)
                    c_t = tl.load(cs_ptr + row + (t + 1) * H, mask=m2, other=0.0).to(ACC)
                    c_prev = _carry_in(cs_ptr + row + t * H, rc_ptr + e * s_rc_e + r2 * s_rc_n + t * s_rc_t + c2, m2,
                                       init2, HAS_INIT, HAS_RESET, ACC)
                    da0, da1, da2, da3, dc = _lstm_bwd_gates(dh, dc, c_t, c_prev, q0, q1, q2, q3)
                    _store_gates(dgx_t, H, m2, da0, da1, da2, da3)
                    if HAS_INIT:
                        dc = _reset_grad(dc, drc_ptr + ((e * N + r2) * T + t) * H + c2, m2, init2, HAS_RESET)
                    tl.store(dc_ptr + (e * N + r2) * H + c2, dc, mask=m2)
                else:
                    h_prev = _carry_in(hs_ptr + row + t * H, rh_ptr + e * s_rh_e + r2 * s_rh_n + t * s_rh_t + c2, m2,
                                       init2, HAS_INIT, HAS_RESET, ACC)
                    da0, da1, da2, dhn, dz = _gru_bwd_gates(dh, h_prev, q0, q1, q2, q3)
                    tl.store(dgx_t, da0, mask=m2)
                    tl.store(dgx_t + H, da1, mask=m2)
                    tl.store(dgx_t + 2 * H, da2, mask=m2)
                    tl.store(dgh_ptr + ((e * N + r2) * T + t) * H + c2, dhn, mask=m2)
                    tl.store(dh_ptr + (e * N + r2) * H + c2, dz, mask=m2)
                    da2 = dhn  # W_hn multiplies h_prev inside r * (W_hn h_prev + b_hn)
                    da3 = tl.zeros((ROWS, HS), dtype=ACC)
                fused = _operand(_join_gates(da0, da1, da2, da3, ROWS, HS), CDT, ACC, UPCAST)
                part_row = part + (s * N + r2) * H + ncol
                for kc in tl.static_range(KC):
                    p = tl.dot(fused, ws[kc], input_precision=PREC, out_dtype=ACC)
                    tl.store(part_row + kc * BK, p, mask=rmask[:, None])
        if SYNC:
            _grid_barrier(flag, (tt - t_begin + 1) * S)
        if PHASE_B:
            for grp in range(pg, tl.cdiv(N, ROWS), P):
                rows = grp * ROWS + tl.arange(0, ROWS)
                rmask = rows < N
                r2 = rows[:, None]
                m2 = rmask[:, None] & (c2 < H)
                if IS_LSTM:
                    acc = tl.zeros((ROWS, HS), dtype=ACC)
                else:
                    acc = tl.load(dh_ptr + (e * N + r2) * H + c2, mask=m2, other=0.0)
                for k in range(S):  # every slice's part, in slice order: read past L1, which the flag does not order
                    acc += tl.load(part + (k * N + r2) * H + c2, mask=m2, other=0.0, cache_modifier=".cg")
                if HAS_INIT:
                    init2 = _init_tile(init_ptr, s_i_e, s_i_n, s_i_t, e, rows, rmask, t, HAS_INIT, ROWS)
                    acc = _reset_grad(acc, drh_ptr + ((e * N + r2) * T + t) * H + c2, m2, init2, HAS_RESET)
                tl.store(dh_ptr + (e * N + r2) * H + c2, acc, mask=m2)
            tl.debug_barrier()  # the next phase A reads this slice of dh in another thread layout
