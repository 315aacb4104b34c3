"""DreamerV3's block-diagonal GRU (the RSSM core of TorchRL's ``DreamerV3BlockGRUCell``).

Per step, input ``x [N, F]``, state ``h [N, H]``, ``nb`` blocks of ``Hb = H / nb``, activation ``act``,
``rms(v) = v * rsqrt(mean(v^2) + eps)``::

    px = act(rms(x @ Wi^T + bi) * ni)                 # input_linear, input_norm         [N, P]
    ph = act(rms(h @ Wh^T + bh) * nh)                 # hidden_linear, hidden_norm       [N, P]
    z  = concat over blocks j of [h_j, px, ph]        # dynamic_linears.0 reads [N, nb, Hb + 2P]
    z  = act(rms(block_linear_k(z)) * n_k)            # each dynamic layer k             [N, H]
    r, c, u = block_linear_gates(z)                   # per block j: [r_j, c_j, u_j], Hb each
    h' = sigmoid(u + update_bias) * tanh(sigmoid(r) * c) + (1 - sigmoid(u + update_bias)) * h

``block_linear``: weight ``[nb, in / nb, out / nb]`` (block ``j`` maps its slice of the input), bias ``[out]``.

How it runs on the library's layer (:class:`~.base.LayerWeights`): ``px`` depends on ``x`` alone, and so does its
share of the first dynamic layer, so both run over the whole sequence at once: :meth:`BlockGRUCell.prepare_input`
computes ``px`` (one GEMM, under autograd), and the backends' input projection ``gi = px @ Wpx^T + b0`` is a
second one, where ``Wpx [H, P]`` gathers the ``px`` rows of ``dynamic_linears.0.weight`` (the same for every
block: ``px`` is repeated, not split). The step keeps the rest: ``hidden_linear`` is the recurrent projection
``gh`` (``weight_hh``), and the block weights, norms and gates are the ``extra`` weights. Parameters are named as
TorchRL's module's state dict, so checkpoints load both ways.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from ..precision import mark_constant_result
from .base import Carry, Cell, LayerWeights, Layout, Saved, StepGrads, check_keys, check_shapes, register

__all__ = ["ACTIVATIONS", "BLOCK_GRU", "block_gru_cell", "init_block_gru_params", "init_weight_"]


def _silu_grad(v: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(v)
    return s * (1 + v * (1 - s))


def _tanh_grad(v: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(v)
    return 1 - t * t


def _relu_grad(v: torch.Tensor) -> torch.Tensor:
    return (v > 0).to(v.dtype)  # 0 at 0, as autograd's relu


# name -> (activation, its derivative at the pre-activation)
ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "silu": (F.silu, _silu_grad),
    "tanh": (torch.tanh, _tanh_grad),
    "relu": (F.relu, _relu_grad),
}


def _derivative(activation: Callable) -> Callable:
    """The derivative of an elementwise ``activation`` at ``v``: one forward-mode product with a tangent of ones (the
    hand-written backward of a callable it has no formula for)."""
    return lambda v: torch.func.jvp(activation, (v,), (torch.ones_like(v),))[1]


def init_weight_(weight: torch.Tensor, fan_in: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """DreamerV3's (and TorchRL's) weight init, in place: truncated normal, std ``1.1368 / sqrt(fan_in)``, cut at 2
    std (a block weight's fan-in is its whole input width)."""
    std = 1.1368 / math.sqrt(fan_in)
    return torch.nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std, generator=generator)


def init_block_gru_params(
    input_size: int,
    hidden_size: int,
    *,
    projection_size: int = 512,
    num_blocks: int = 8,
    num_layers: int = 1,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """Block GRU parameters under TorchRL's ``DreamerV3BlockGRUCell`` state-dict names, initialised as it does:
    weights truncated normal (std ``1.1368 / sqrt(fan_in)``, cut at 2 std; a block weight's fan-in is its whole
    input width), biases zero, norm scales one. ``num_layers``: dynamics layers (one recurrent layer)."""
    for name, value in (("input_size", input_size), ("hidden_size", hidden_size), ("projection_size", projection_size),
                        ("num_blocks", num_blocks), ("num_layers", num_layers)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}.")
    if hidden_size % num_blocks:
        raise ValueError(f"hidden_size must be divisible by num_blocks, got {hidden_size} and {num_blocks}.")
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    H, P, nb = hidden_size, projection_size, num_blocks

    def weight(shape, fan_in):
        return init_weight_(torch.empty(shape, dtype=dtype, device=device), fan_in, generator)

    zeros = functools.partial(torch.zeros, dtype=dtype, device=device)
    ones = functools.partial(torch.ones, dtype=dtype, device=device)
    tensors = {
        "input_linear.weight": weight((P, input_size), input_size), "input_linear.bias": zeros(P),
        "input_norm.weight": ones(P),
        "hidden_linear.weight": weight((P, H), H), "hidden_linear.bias": zeros(P),
        "hidden_norm.weight": ones(P),
    }
    for k in range(num_layers):
        fan_in = H + 2 * P * nb if k == 0 else H
        tensors[f"dynamic_linears.{k}.weight"] = weight((nb, fan_in // nb, H // nb), fan_in)
        tensors[f"dynamic_linears.{k}.bias"] = zeros(H)
        tensors[f"dynamic_norms.{k}.weight"] = ones(H)
    tensors["gates.weight"] = weight((nb, H // nb, 3 * H // nb), H)
    tensors["gates.bias"] = zeros(3 * H)
    return TensorDict(tensors, batch_size=[], device=device)


def _rms(v: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(v * r, r)`` with ``r = rsqrt(mean(v^2) + eps)`` over the last dim (``r [N, 1]``)."""
    r = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return v * r, r


def _norm_backward(d_out, s, sh, qh, r, hr) -> tuple[torch.Tensor, torch.Tensor]:
    """Through ``out = act(rms(pre) * scale)`` (factors from ``BlockGRUCell._norm_factors``): the cotangent of
    ``pre``, ``r * d_hat - hr * sum(d_hat * hat)`` with ``d_hat = d_out * act' * scale``, and the rows of the
    cotangent of ``scale``."""
    d_pre = torch.addcmul(r * (d_out * s), hr, (d_out * sh).sum(-1, keepdim=True), value=-1)
    return d_pre, d_out * qh


def _blocks(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Block-diagonal ``v [N, nb * I] -> [N, nb * O]`` with ``weight [nb, I, O]`` (one batched GEMM)."""
    nb = weight.shape[0]
    out = torch.bmm(v.reshape(v.shape[0], nb, -1).transpose(0, 1), weight)  # [nb, N, O]
    return out.transpose(0, 1).reshape(v.shape[0], -1)


def _blocks_t(d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The cotangent of :func:`_blocks`' input from ``d [N, nb * O]``."""
    nb = weight.shape[0]
    out = torch.bmm(d.reshape(d.shape[0], nb, -1).transpose(0, 1), weight.transpose(1, 2))
    return out.transpose(0, 1).reshape(d.shape[0], -1)


def _shared_rows(weight0: torch.Tensor, start: int, width: int) -> torch.Tensor:
    """Rows ``start:start + width`` of every block of ``dynamic_linears.0.weight [nb, I, Hb]`` as one ``[H, width]``
    matrix (an input repeated in every block feeds them all: one GEMM); a fresh tensor (with one block the reshape
    alone is a view of ``weight0``, and two views of it as inputs of ``scan`` fail to compile: "aliasing")."""
    part = weight0[..., start:start + width, :]  # [nb, width, Hb]
    return part.transpose(-1, -2).reshape(*weight0.shape[:-3], -1, width).contiguous()


_FLOATS: dict[str, tuple[float, float]] = {}  # (norm_eps, update_bias) of each cell, by its name


@mark_constant_result
def _floats(name: str) -> tuple[float, float]:
    """A cell's ``(norm_eps, update_bias)``: constants of a compiled graph. Read as attributes, under
    ``torch.compile(dynamic=True)`` they became ``SymFloat`` graph inputs, which torch's ``scan`` refuses as inputs of
    its body (and ``F.rms_norm`` needs a Python ``eps``)."""
    return _FLOATS[name]


class BlockGRUCell(Cell):
    """Carry ``(h [N, H],)``. ``weight_ih = Wpx [H, P]``, ``bias_ih = dynamic_linears.0.bias``, ``weight_hh`` /
    ``bias_hh`` = ``hidden_linear``'s; ``extra = (hidden_norm.weight, W0h [nb, Hb, Hb], Wph [H, P],
    dynamic_norms.0.weight, *(dynamic_linears.k.weight, .bias, dynamic_norms.k.weight for k >= 1), gates.weight,
    gates.bias)``. One instance per ``(activation, norm_eps, update_bias)``: :func:`block_gru_cell`."""

    title = "block GRU"
    base_name = "block_gru"
    state_names = ("h",)
    state_doc = "``h [*B, 1, H]``"
    params_doc = "DreamerV3BlockGRUCell state-dict keys (input_linear.weight, ..., gates.bias)"
    init_function = "init_block_gru_params"
    hidden_keys = ("hidden_linear.weight", "hidden_linear.bias", "hidden_norm.weight")
    hidden_first = False  # the first dynamic layer's block j reads [h_j, px, ph] (the RSSM core: [h_j, ph, px])

    def __init__(self, activation: str | Callable, norm_eps: float, update_bias: float):
        self.activation, norm_eps, update_bias = activation, float(norm_eps), float(update_bias)
        named = isinstance(activation, str)
        label = activation if named else f"{getattr(activation, '__name__', type(activation).__name__)}@{id(activation):x}"
        default = (activation, norm_eps, update_bias) == ("silu", 1e-4, -1.0)
        self.name = self.base_name if default else f"{self.base_name}[{label},{norm_eps!r},{update_bias!r}]"
        _FLOATS[self.name] = (norm_eps, update_bias)
        self._act, self._act_grad = ACTIVATIONS[activation] if named else (activation, _derivative(activation))

    @staticmethod
    def dynamic_keys(k: int) -> tuple[str, str, str]:
        """Dynamics layer ``k``'s block weight, bias and norm scale."""
        return f"dynamic_linears.{k}.weight", f"dynamic_linears.{k}.bias", f"dynamic_norms.{k}.weight"

    @property
    def norm_eps(self) -> float:
        return _floats(self.name)[0]

    @property
    def update_bias(self) -> float:
        return _floats(self.name)[1]

    def read_layout(self, params: Mapping[str, torch.Tensor]) -> Layout:
        keys = set(params.keys())
        num_layers = 0
        while f"dynamic_linears.{num_layers}.weight" in keys:
            num_layers += 1
        fixed = {"input_linear.weight", "input_linear.bias", "input_norm.weight", "hidden_linear.weight",
                 "hidden_linear.bias", "hidden_norm.weight", "gates.weight", "gates.bias"}
        dynamic = {f"dynamic_{kind}.{k}.{t}" for k in range(max(num_layers, 1))
                   for kind, t in (("linears", "weight"), ("linears", "bias"), ("norms", "weight"))}
        check_keys(keys, fixed | dynamic, f"a {self.title} with {max(num_layers, 1)} dynamics layer(s)")
        wi, gates = params["input_linear.weight"], params["gates.weight"]
        if wi.ndim != 2 or gates.ndim != 3:
            raise ValueError(
                f"params: expected input_linear.weight [P, F] and gates.weight [nb, H/nb, 3H/nb], got "
                f"{list(wi.shape)} and {list(gates.shape)}. Are these params of another cell kind?"
            )
        (P, F_in), (nb, Hb) = wi.shape, gates.shape[:2]
        H = nb * Hb
        want = {"input_linear.weight": (P, F_in), "input_linear.bias": (P,), "input_norm.weight": (P,),
                "hidden_linear.weight": (P, H), "hidden_linear.bias": (P,), "hidden_norm.weight": (P,),
                "gates.weight": (nb, Hb, 3 * Hb), "gates.bias": (3 * H,)}
        for k in range(num_layers):
            want[f"dynamic_linears.{k}.weight"] = (nb, (Hb + 2 * P) if k == 0 else Hb, Hb)
            want[f"dynamic_linears.{k}.bias"] = want[f"dynamic_norms.{k}.weight"] = (H,)
        check_shapes(params, want, f"the {self.title} with input_size={F_in}, hidden_size={H}, projection_size={P}, "
                     f"num_blocks={nb}", "input_linear.weight")
        return Layout(self, 1, F_in, H, (H,), wi.dtype, wi.device, bias=True)

    def prepare_input(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``px = act(rms(x @ Wi^T + bi) * ni)`` for every step at once: ``[..., F] -> [..., P]``."""
        return self.project(x, params["input_linear.weight"], params["input_linear.bias"], params["input_norm.weight"])

    def project(self, v: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``act(rms(v @ weight^T + bias) * scale)``."""
        v = F.linear(v, weight, bias)
        return self._act(F.rms_norm(v, v.shape[-1:], scale, self.norm_eps))

    def layer_weights(self, params: Mapping[str, torch.Tensor], layout: Layout, k: int) -> LayerWeights:
        w0, b0, n0 = (params[key] for key in self.dynamic_keys(0))
        wh, bh, nh = (params[key] for key in self.hidden_keys)
        P, hb = nh.shape[-1], w0.shape[-1]
        px_width = w0.shape[-2] - hb - P
        px_at, ph_at = (hb + P, hb) if self.hidden_first else (hb, hb + px_width)
        deeper, j = [], 1
        while self.dynamic_keys(j)[0] in params:
            deeper += [params[key] for key in self.dynamic_keys(j)]
            j += 1
        return LayerWeights(
            weight_ih=_shared_rows(w0, px_at, px_width), bias_ih=b0, weight_hh=wh, bias_hh=bh,
            extra=(nh, w0[..., :hb, :].contiguous(), _shared_rows(w0, ph_at, P), n0, *deeper,
                   params["gates.weight"], params["gates.bias"]),
        )

    def layer_step_saving(self, gi: torch.Tensor, carry: Carry, w: LayerWeights) -> tuple[Carry, Saved]:
        """``gi = px @ Wpx^T + b0 [N, H]`` -> ``((h',), saved)``; ``saved``: every RMS norm's input (hidden, then
        each dynamic layer) and the gate pre-activations ``[N, 3H]``; :meth:`backward_factors` derives the rest."""
        (h,), eps, act = carry, self.norm_eps, self._act
        norm_h, w0h, wph, norm_0, *rest = w.extra
        *deeper, gates_w, gates_b = rest
        a = F.linear(h, w.weight_hh, w.bias_hh)
        ph = act(F.rms_norm(a, a.shape[-1:], norm_h, eps))
        pre = torch.addmm(gi + _blocks(h, w0h), ph, wph.transpose(-1, -2))
        saved = [a, pre]
        z = act(F.rms_norm(pre, pre.shape[-1:], norm_0, eps))
        for j in range(0, len(deeper), 3):
            weight, bias, norm = deeper[j : j + 3]
            pre = _blocks(z, weight) + bias
            saved.append(pre)
            z = act(F.rms_norm(pre, pre.shape[-1:], norm, eps))
        g = _blocks(z, gates_w) + gates_b
        return (self._update(g, h, gates_w.shape[-3]),), (*saved, g)

    def _update(self, g: torch.Tensor, h: torch.Tensor, nb: int) -> torch.Tensor:
        """``h'`` from the gate pre-activations, on per-block views (no copies of ``r, c, u``)."""
        n = h.shape[0]
        per_block = g.reshape(n, nb, 3, -1)
        r, c, u = per_block[:, :, 0], per_block[:, :, 1], per_block[:, :, 2]
        u = torch.sigmoid(u + self.update_bias)
        return (u * torch.tanh(torch.sigmoid(r) * c) + (1 - u) * h.reshape(n, nb, -1)).reshape(n, -1)

    def backward_factors(self, saved: Saved, carry: Carry, w: LayerWeights) -> Saved:
        """Everything elementwise the step backward reads, for one step or many at once: the gates' factor ``K``
        (``d_g = dh' * K``, block-major as ``g``) and ``1 - u``; for the hidden projection and each dynamic layer
        the factors of :func:`_norm_backward` and the output (:meth:`_norm_factors`)."""
        (h,) = carry
        a, *pres, g = saved
        norm_h, w0h, _, norm_0, *rest = w.extra
        *deeper, _, _ = rest
        nb = w0h.shape[-3]
        r_in, c_in, u_in = _split_gates(g, nb)
        r, u = torch.sigmoid(r_in), torch.sigmoid(u_in + self.update_bias)
        cand = torch.tanh(r * c_in)
        d_rc = u * (1 - cand * cand)
        gate_factor = _join_gates(d_rc * c_in * r * (1 - r), d_rc * r, (cand - h) * u * (1 - u), nb)
        out = [gate_factor, 1 - u]
        for pre, n in zip((a, *pres), (norm_h, norm_0, *deeper[2::3])):
            out += self._norm_factors(pre, n)
        return tuple(out)

    def _norm_factors(self, pre: torch.Tensor, scale: torch.Tensor) -> list[torch.Tensor]:
        """What :func:`_norm_backward` reads for ``out = act(rms(pre) * scale)``, and ``out`` last."""
        hat, r = _rms(pre, self.norm_eps)
        q = self._act_grad(hat * scale)
        s = q * scale
        return [s, s * hat, q * hat, r, hat * r / pre.shape[-1], self._act(hat * scale)]

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        """``d_gi``: the first dynamic layer's pre-activation; ``d_gh``: ``hidden_linear``'s output. ``d_extra``
        holds per-row factors that :meth:`reduce_extra_grads` turns into the extra weights' gradients."""
        (h,), (dh_new,) = carry, d_new
        gate_factor, keep, *norms = factors
        _, w0h, wph, _, *rest = w.extra
        *deeper, gates_w, _ = rest
        n, nb = h.shape[0], w0h.shape[-3]
        hidden, layers = norms[:6], [norms[i : i + 6] for i in range(6, len(norms), 6)]
        d_g = (dh_new.reshape(n, nb, 1, -1) * gate_factor.reshape(n, nb, 3, -1)).reshape(n, -1)
        d_z = _blocks_t(d_g, gates_w)
        per_layer = []  # (d_pre, d_norm rows) per dynamic layer, last to first
        for k in range(len(layers) - 1, -1, -1):
            per_layer.append(_norm_backward(d_z, *layers[k][:5]))
            if k:
                d_z = _blocks_t(per_layer[-1][0], deeper[3 * (k - 1)])
        per_layer.reverse()
        d_pre0 = per_layer[0][0]
        # the first dynamic layer's recurrent inputs: h's own block, and ph (shared by every block)
        d_a, d_norm_h = _norm_backward(d_pre0 @ wph, *hidden[:5])
        d_h = torch.addcmul(_blocks_t(d_pre0, w0h), dh_new, keep) + d_a @ w.weight_hh
        blocks = lambda t: t.reshape(n, nb, -1)  # noqa: E731  (the block weights' factors)
        factors_out = [d_norm_h, blocks(h), d_pre0, hidden[5], per_layer[0][1]]
        for k in range(1, len(layers)):
            factors_out += [blocks(layers[k - 1][5]), blocks(per_layer[k][0]), per_layer[k][1]]
        factors_out += [blocks(layers[-1][5]), blocks(d_g)]
        return StepGrads((d_h,), d_pre0, d_a, tuple(factors_out))

    def reduce_extra_grads(self, *per_step: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The extra weights' gradients from :meth:`step_backward_saved`'s per-row factors stacked over time
        (``[T, N, ·]`` each): every weight gradient is one GEMM over all ``T * N`` rows, not one per step."""
        d_norm_h, h, d_pre0, ph, d_norm0, *rest = per_step
        *deeper, z_last, d_g = rest
        d_pre0_blocks = d_pre0.reshape(h.shape)
        grads = [_sum_rows(d_norm_h), _block_outer(h, d_pre0_blocks), _rows(d_pre0).T @ _rows(ph), _sum_rows(d_norm0)]
        for j in range(0, len(deeper), 3):
            z_in, d_pre, d_norm = deeper[j : j + 3]
            grads += [_block_outer(z_in, d_pre), _sum_rows(d_pre).reshape(-1), _sum_rows(d_norm)]
        return (*grads, _block_outer(z_last, d_g), _sum_rows(d_g).reshape(-1))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``[T, N, K] -> [T * N, K]``."""
    return t.reshape(-1, t.shape[-1])


def _sum_rows(t: torch.Tensor) -> torch.Tensor:
    """The sum over time and batch: ``[T, N, ...] -> [...]``."""
    return t.sum(dim=(0, 1))


def _block_outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_{t, n} a[t, n, j]^T b[t, n, j]`` per block ``j``: ``[T, N, nb, I], [T, N, nb, O] -> [nb, I, O]``
    (one batched GEMM over all ``T * N`` rows)."""
    nb = a.shape[-2]
    return torch.bmm(a.reshape(-1, nb, a.shape[-1]).permute(1, 2, 0), b.reshape(-1, nb, b.shape[-1]).transpose(0, 1))


def _split_gates(g: torch.Tensor, nb: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``g [..., 3H]`` (block-major: block ``j`` holds its ``r, c, u``, ``Hb`` each) -> ``r, c, u`` ``[..., H]`` each."""
    per_block = g.reshape(*g.shape[:-1], nb, 3, -1)
    return tuple(per_block[..., i, :].reshape(*g.shape[:-1], -1) for i in range(3))


def _join_gates(d_r: torch.Tensor, d_c: torch.Tensor, d_u: torch.Tensor, nb: int) -> torch.Tensor:
    """The inverse of :func:`_split_gates`."""
    lead = d_r.shape[:-1]
    return torch.stack([d.reshape(*lead, nb, -1) for d in (d_r, d_c, d_u)], dim=-2).reshape(*lead, -1)


_CELLS: dict[tuple, BlockGRUCell] = {}


def block_gru_cell(activation: str | Callable = "silu", norm_eps: float = 1e-4, update_bias: float = -1.0,
                   kind: type[BlockGRUCell] = BlockGRUCell) -> BlockGRUCell:
    """The cell of ``kind`` (the block GRU, or a subclass: the RSSM core) for these hyperparameters: one instance each,
    made on first use (backends and compiled graphs key on it; a plain dict rather than ``functools.cache``, whose
    wrapper Dynamo does not trace). ``activation``: a name of :data:`ACTIVATIONS` or any elementwise callable (a
    parameter-free module or a function, held by identity; its derivative comes from ``torch.func.jvp``)."""
    key = (kind, activation, float(norm_eps), float(update_bias))
    cell = _CELLS.get(key)  # first: under torch.compile(dynamic=True) the floats are symbolic, which _make_cell refuses
    if cell is None:
        _make_cell(*key)
        cell = _CELLS[key]
    return cell


@mark_constant_result
def _make_cell(kind: type[BlockGRUCell], activation, *floats: float) -> None:
    """Make the cell of these hyperparameters unless it exists: for real even while Dynamo traces (a callable
    activation's cell is made on its first use, compiled or not), since its constants (:func:`_floats`) are read at
    trace time, before Dynamo would replay the writes."""
    if (kind, activation, *floats) in _CELLS:
        return
    if not (activation in ACTIVATIONS if isinstance(activation, str) else callable(activation)):
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)} or an elementwise callable (e.g. "
                         f"torch.sin, nn.Sigmoid()), got {activation!r}.")
    _CELLS[(kind, activation, *floats)] = register(kind(activation, *floats))


BLOCK_GRU = block_gru_cell()
for _name in ACTIVATIONS:  # the defaults of every activation, made and registered here, before any compile
    block_gru_cell(_name)
del _name
