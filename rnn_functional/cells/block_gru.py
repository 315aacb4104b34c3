"""DreamerV3's block-diagonal GRU under TorchRL's ``DreamerV3BlockGRUCell`` state-dict names (math and how it runs:
docs/model_based.md; each RMS norm scaled by its ``*_norm.weight``; a block weight is ``[nb, in / nb, out / nb]``)."""

from __future__ import annotations

import math
import types
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


def init_weight_(weight: torch.Tensor, fan_in: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """DreamerV3's (and TorchRL's) weight init, in place: truncated normal, std ``1.1368 / sqrt(fan_in)``, cut at 2
    std (a block weight's fan-in is its whole input width)."""
    std = 1.1368 / math.sqrt(fan_in)
    return torch.nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std, generator=generator)


def check_block_sizes(hidden: str, **sizes: int) -> None:
    """Raise ``ValueError`` unless every size (argument: value) is positive and ``num_blocks`` divides ``hidden``'s."""
    for name, value in sizes.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}.")
    if sizes[hidden] % sizes["num_blocks"]:
        raise ValueError(f"{hidden} must be divisible by num_blocks, got {sizes[hidden]} and {sizes['num_blocks']}.")


def init_block_gru_params(input_size: int, hidden_size: int, *, projection_size: int = 512, num_blocks: int = 8,
                          num_layers: int = 1, dtype: torch.dtype | None = None,
                          device: torch.device | str | None = None,
                          generator: torch.Generator | None = None) -> TensorDict:
    """Block GRU parameters under TorchRL's ``DreamerV3BlockGRUCell`` state-dict names, initialised as it does:
    weights truncated normal (std ``1.1368 / sqrt(fan_in)``, cut at 2 std; a block weight's fan-in is its whole
    input width), biases zero, norm scales one. ``num_layers``: dynamics layers (one recurrent layer)."""
    check_block_sizes("hidden_size", input_size=input_size, hidden_size=hidden_size, projection_size=projection_size,
                      num_blocks=num_blocks, num_layers=num_layers)
    return BlockGRUCell.init_params((input_size,), hidden_size, projection_size, num_blocks, num_layers, dtype, device,
                                    generator)


def _norm_backward(d_out, s, sh, qh, r, hr) -> tuple[torch.Tensor, torch.Tensor]:
    """Through ``out = act(rms(pre) * scale)`` (factors: ``BlockGRUCell._norm_factors``): ``d_pre = r * d_hat - hr *
    sum(d_hat * hat)`` with ``d_hat = d_out * act' * scale``, and the rows of ``d_scale``."""
    d_pre = torch.addcmul(r * (d_out * s), hr, (d_out * sh).sum(-1, keepdim=True), value=-1)
    return d_pre, d_out * qh


def _blocks(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Block-diagonal ``v [N, nb * I] -> [N, nb * O]`` with ``weight [nb, I, O]`` (one batched GEMM); its transpose
    (the cotangent of ``v``) is ``_blocks(d, weight.transpose(1, 2))``."""
    nb = weight.shape[0]
    out = torch.bmm(v.reshape(v.shape[0], nb, -1).transpose(0, 1), weight)  # [nb, N, O]
    return out.transpose(0, 1).reshape(v.shape[0], -1)


def _shared_rows(weight0: torch.Tensor, start: int, width: int) -> torch.Tensor:
    """Rows ``start:start + width`` of every block of ``dynamic_linears.0.weight [nb, I, Hb]`` as one fresh
    ``[H, width]`` matrix (two views of one weight as inputs of ``scan`` fail to compile: "aliasing")."""
    part = weight0[..., start:start + width, :]  # [nb, width, Hb]
    return part.transpose(-1, -2).reshape(*weight0.shape[:-3], -1, width).contiguous()


_FLOATS: dict[str, tuple[float, float]] = {}  # (norm_eps, update_bias) of each cell, by its name


@mark_constant_result
def _floats(name: str) -> tuple[float, float]:
    """A cell's ``(norm_eps, update_bias)`` as constants of a compiled graph: read as attributes under
    ``torch.compile(dynamic=True)`` they become ``SymFloat`` inputs, which ``scan``'s body and ``F.rms_norm`` refuse."""
    return _FLOATS[name]


class BlockGRUCell(Cell):
    """Carry ``(h [N, H],)``. ``weight_ih = Wpx [H, P]``, ``bias_ih = dynamic_linears.0.bias``, ``weight_hh`` /
    ``bias_hh`` = ``hidden_linear``'s; ``extra = (hidden_norm.weight, W0h [nb, Hb, Hb], Wph [H, P],
    dynamic_norms.0.weight, *(dynamic_linears.k.weight, .bias, dynamic_norms.k.weight for k >= 1), gates.weight,
    gates.bias)``. One instance per ``(activation, norm_eps, update_bias)``: :func:`block_gru_cell`."""

    title = "block GRU"
    base_name = "block_gru"
    state_doc = "``h [*B, 1, H]``"
    params_doc = "DreamerV3BlockGRUCell state-dict keys (input_linear.weight, ..., gates.bias)"
    init_function = "init_block_gru_params"
    # (weight, bias, norm scale) of each input's projection and of the hidden state's
    input_keys = (("input_linear.weight", "input_linear.bias", "input_norm.weight"),)
    hidden_keys = ("hidden_linear.weight", "hidden_linear.bias", "hidden_norm.weight")
    hidden_first = False  # in the state dict, and in block j of the first dynamic layer: [h_j, px, ph] (RSSM: ph first)
    sizes = "input_size={0}, hidden_size={H}, projection_size={P}, num_blocks={nb}"  # in messages; {0}: inputs' widths

    def __init__(self, activation: str | Callable, norm_eps: float, update_bias: float):
        self.activation, norm_eps, update_bias = activation, float(norm_eps), float(update_bias)
        named = isinstance(activation, str)
        label = activation if named else f"{getattr(activation, '__name__', type(activation).__name__)}@{id(activation):x}"
        default = (activation, norm_eps, update_bias) == ("silu", 1e-4, -1.0)
        self.name = self.base_name if default else f"{self.base_name}[{label},{norm_eps!r},{update_bias!r}]"
        _FLOATS[self.name] = (norm_eps, update_bias)
        self._act, self._act_grad = ACTIVATIONS[activation] if named else (  # no formula: one forward-mode product
            activation, lambda v: torch.func.jvp(activation, (v,), (torch.ones_like(v),))[1])

    @staticmethod
    def dynamic_keys(k: int) -> tuple[str, str, str]:
        """Dynamics layer ``k``'s block weight, bias and norm scale."""
        return f"dynamic_linears.{k}.weight", f"dynamic_linears.{k}.bias", f"dynamic_norms.{k}.weight"

    @classmethod
    def ordered(cls, hidden, inputs: tuple) -> tuple:
        """``hidden`` and ``inputs`` (one per input projection) in state-dict order."""
        return (hidden, *inputs) if cls.hidden_first else (*inputs, hidden)

    @classmethod
    def num_dynamic(cls, keys) -> int:
        """The number of dynamics layers in ``keys``."""
        k = 0
        while cls.dynamic_keys(k)[0] in keys:
            k += 1
        return k

    @classmethod
    def shapes(cls, widths, H: int, P: int, nb: int, num_layers: int) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape in state-dict order, for inputs of ``widths``."""
        shapes = {}
        for (w, b, n), width in zip(cls.ordered(cls.hidden_keys, cls.input_keys), cls.ordered(H, widths)):
            shapes.update({w: (P, width), b: (P,), n: (P,)})
        for k in range(num_layers):
            rows = (H + (1 + len(widths)) * P * nb if k == 0 else H) // nb  # layer 0: h's block and every projection
            shapes.update(zip(cls.dynamic_keys(k), ((nb, rows, H // nb), (H,), (H,))))
        return {**shapes, "gates.weight": (nb, H // nb, 3 * H // nb), "gates.bias": (3 * H,)}

    @classmethod
    def init_params(cls, widths: tuple[int, ...], H: int, P: int, nb: int, num_layers: int, dtype, device,
                    generator) -> TensorDict:
        """Parameters for inputs of ``widths`` in TorchRL's order and draws: weights by :func:`init_weight_` (a block
        weight's fan-in: its whole input width), biases zero, norm scales one."""
        tensors = {}
        for key, shape in cls.shapes(widths, H, P, nb, num_layers).items():
            if len(shape) == 1:  # a norm scale (``.weight``): ones; a bias: zeros
                tensors[key] = torch.full(shape, float(key.endswith(".weight")), dtype=dtype, device=device)
            else:  # [P, width] or [nb, in / nb, out / nb]
                fan_in = shape[1] if len(shape) == 2 else shape[0] * shape[1]
                tensors[key] = init_weight_(torch.empty(shape, dtype=dtype, device=device), fan_in, generator)
        return TensorDict(tensors, batch_size=[], device=device)

    def read_layout(self, params: Mapping[str, torch.Tensor]) -> Layout:
        keys = set(params.keys())
        num_layers, projections = self.num_dynamic(keys), self.ordered(self.hidden_keys, self.input_keys)
        groups = (*projections, *map(self.dynamic_keys, range(max(num_layers, 1))), ("gates.weight", "gates.bias"))
        check_keys(keys, {key for group in groups for key in group},
                   f"the {self.title} with {max(num_layers, 1)} dynamics layer(s)")
        weights, gates = [params[w] for w, _, _ in projections], params["gates.weight"]
        if gates.ndim != 3 or any(w.ndim != 2 for w in weights):
            raise ValueError(f"params: expected {', '.join(f'{w} [P, ·]' for w, _, _ in projections)} and gates.weight "
                             f"[nb, H/nb, 3H/nb], got {', '.join(str(list(w.shape)) for w in weights)} and "
                             f"{list(gates.shape)}. Are these params of another cell kind?")
        (nb, hb), P = gates.shape[:2], weights[0].shape[0]
        H, widths = nb * hb, [params[w].shape[-1] for w, _, _ in self.input_keys]
        check_shapes(params, self.shapes(widths, H, P, nb, num_layers),
                     f"the {self.title} with {self.sizes.format(*widths, H=H, P=P, nb=nb)}", projections[0][0])
        return Layout(self, 1, sum(widths), H, (H,), weights[0].dtype, weights[0].device, bias=True)

    def prepare_input(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``px = act(rms(x @ Wi^T + bi) * ni)`` for every step at once: ``[..., F] -> [..., P]``."""
        return self.project(x, params["input_linear.weight"], params["input_linear.bias"], params["input_norm.weight"])

    def project(self, v: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``act(rms(v @ weight^T + bias) * scale)``."""
        v = F.linear(v, weight, bias)
        return self._act(F.rms_norm(v, v.shape[-1:], scale, _floats(self.name)[0]))

    def layer_weights(self, params: Mapping[str, torch.Tensor], layout: Layout, k: int) -> LayerWeights:
        w0, b0, n0 = (params[key] for key in self.dynamic_keys(0))
        wh, bh, nh = (params[key] for key in self.hidden_keys)
        P, hb = nh.shape[-1], w0.shape[-1]
        px_width = w0.shape[-2] - hb - P
        px_at, ph_at = (hb + P, hb) if self.hidden_first else (hb, hb + px_width)
        deeper = [params[key] for j in range(1, self.num_dynamic(params)) for key in self.dynamic_keys(j)]
        return LayerWeights(_shared_rows(w0, px_at, px_width), b0, wh, bh, (nh, w0[..., :hb, :].contiguous(),
                            _shared_rows(w0, ph_at, P), n0, *deeper, params["gates.weight"], params["gates.bias"]))

    def layer_step_saving(self, gi: torch.Tensor, carry: Carry, w: LayerWeights) -> tuple[Carry, Saved]:
        """``gi = px @ Wpx^T + b0 [N, H]`` -> ``((h',), saved)``; ``saved``: every RMS norm's input (hidden, then
        each dynamic layer) and the gate pre-activations ``[N, 3H]``; :meth:`backward_factors` derives the rest."""
        (h,), (eps, update_bias), act = carry, _floats(self.name), self._act
        norm_h, w0h, wph, norm_0, *deeper, gates_w, gates_b = w.extra
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
        n, nb = h.shape[0], gates_w.shape[-3]
        r, c, u = g.reshape(n, nb, 3, -1).unbind(-2)  # per-block views (no copies): g is block-major
        u = torch.sigmoid(u + update_bias)
        h_new = u * torch.tanh(torch.sigmoid(r) * c) + (1 - u) * h.reshape(n, nb, -1)
        return (h_new.reshape(n, -1),), (*saved, g)

    def backward_factors(self, saved: Saved, carry: Carry, w: LayerWeights) -> Saved:
        """The gates' factor ``K`` (``d_g = dh' * K``, block-major as ``g``), ``1 - u``, then :meth:`_norm_factors` of
        the hidden projection and of each dynamic layer; elementwise, so for one step or many at once."""
        (h,) = carry
        a, *pres, g = saved
        norm_h, w0h, _, norm_0, *deeper, _, _ = w.extra
        lead, nb = g.shape[:-1], w0h.shape[-3]
        # [..., nb, Hb] each (g is block-major), contiguous: strided views take other (last-bit) elementwise kernels
        r_in, c_in, u_in = g.reshape(*lead, nb, 3, -1).movedim(-2, 0).contiguous().unbind(0)
        r, u = torch.sigmoid(r_in), torch.sigmoid(u_in + _floats(self.name)[1])
        cand = torch.tanh(r * c_in)
        d_rc = u * (1 - cand * cand)
        d_u = (cand - h.reshape(*h.shape[:-1], nb, -1)) * u * (1 - u)
        gate_factor = torch.stack([d_rc * c_in * r * (1 - r), d_rc * r, d_u], dim=-2).reshape(*lead, -1)
        out = [gate_factor, (1 - u).reshape(*lead, -1)]
        for pre, n in zip((a, *pres), (norm_h, norm_0, *deeper[2::3])):
            out += self._norm_factors(pre, n)
        return tuple(out)

    def _norm_factors(self, pre: torch.Tensor, scale: torch.Tensor) -> list[torch.Tensor]:
        """What :func:`_norm_backward` reads for ``out = act(rms(pre) * scale)``, and ``out`` last."""
        r = torch.rsqrt(pre.pow(2).mean(-1, keepdim=True) + _floats(self.name)[0])  # [..., 1]
        hat = pre * r
        q = self._act_grad(hat * scale)
        s = q * scale
        return [s, s * hat, q * hat, r, hat * r / pre.shape[-1], self._act(hat * scale)]

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        """``d_gi``: the first dynamic layer's pre-activation; ``d_gh``: ``hidden_linear``'s output. ``d_extra``
        holds per-row factors that :meth:`reduce_extra_grads` turns into the extra weights' gradients."""
        (h,), (dh_new,) = carry, d_new
        gate_factor, keep, *norms = factors
        _, w0h, wph, _, *deeper, gates_w, _ = w.extra
        n, nb = h.shape[0], w0h.shape[-3]
        hidden, layers = norms[:6], [norms[i : i + 6] for i in range(6, len(norms), 6)]
        d_g = (dh_new.reshape(n, nb, 1, -1) * gate_factor.reshape(n, nb, 3, -1)).reshape(n, -1)
        d_z = _blocks(d_g, gates_w.transpose(1, 2))
        per_layer = []  # (d_pre, d_norm rows) per dynamic layer, last to first
        for k in range(len(layers) - 1, -1, -1):
            per_layer.append(_norm_backward(d_z, *layers[k][:5]))
            if k:
                d_z = _blocks(per_layer[-1][0], deeper[3 * (k - 1)].transpose(1, 2))
        per_layer.reverse()
        d_pre0 = per_layer[0][0]
        # the first dynamic layer's recurrent inputs: h's own block, and ph (shared by every block)
        d_a, d_norm_h = _norm_backward(d_pre0 @ wph, *hidden[:5])
        d_h = torch.addcmul(_blocks(d_pre0, w0h.transpose(1, 2)), dh_new, keep) + d_a @ w.weight_hh
        blocks = lambda t: t.reshape(n, nb, -1)  # noqa: E731  (the block weights' factors)
        factors_out = [d_norm_h, blocks(h), d_pre0, hidden[5], per_layer[0][1]]
        for k in range(1, len(layers)):
            factors_out += [blocks(layers[k - 1][5]), blocks(per_layer[k][0]), per_layer[k][1]]
        factors_out += [blocks(layers[-1][5]), blocks(d_g)]
        return StepGrads((d_h,), d_pre0, d_a, tuple(factors_out))

    def reduce_extra_grads(self, *per_step: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The extra weights' gradients from :meth:`step_backward_saved`'s per-row factors stacked over time
        (``[T, N, ·]`` each): every weight gradient is one GEMM over all ``T * N`` rows, not one per step."""
        d_norm_h, h, d_pre0, ph, d_norm0, *deeper, z_last, d_g = per_step
        # reshape, not flatten: torch's legacy vmap (a batched backward) has no batching rule for flatten
        grads = [d_norm_h.sum((0, 1)), _block_outer(h, d_pre0.reshape(h.shape)),
                 d_pre0.reshape(-1, d_pre0.shape[-1]).T @ ph.reshape(-1, ph.shape[-1]), d_norm0.sum((0, 1))]
        for j in range(0, len(deeper), 3):
            z_in, d_pre, d_norm = deeper[j : j + 3]
            grads += [_block_outer(z_in, d_pre), d_pre.sum((0, 1)).reshape(-1), d_norm.sum((0, 1))]
        return (*grads, _block_outer(z_last, d_g), d_g.sum((0, 1)).reshape(-1))


def _block_outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_{t, n} a[t, n, j]^T b[t, n, j]`` per block ``j``: ``[T, N, nb, I], [T, N, nb, O] -> [nb, I, O]``
    (one batched GEMM over all ``T * N`` rows)."""
    nb = a.shape[-2]
    return torch.bmm(a.reshape(-1, nb, a.shape[-1]).permute(1, 2, 0), b.reshape(-1, nb, b.shape[-1]).transpose(0, 1))


_CELLS: dict[tuple, BlockGRUCell] = {}
_MADE = types.SimpleNamespace()  # the cells as attributes c<id>: Dynamo reads one as it is, a dict as it first saw it


def block_gru_cell(activation: str | Callable = "silu", norm_eps: float = 1e-4, update_bias: float = -1.0,
                   kind: type[BlockGRUCell] = BlockGRUCell) -> BlockGRUCell:
    """The cell of ``kind`` (block GRU or RSSM core) for these hyperparameters, made on first use (a plain dict: Dynamo
    does not trace ``functools.cache``). ``activation``: a name of :data:`ACTIVATIONS` or an elementwise callable."""
    key = (kind, activation, float(norm_eps), float(update_bias))
    # traced, not _CELLS.get: Dynamo would guard on a miss that the cell _make_cell makes at once breaks
    cell = None if torch.compiler.is_compiling() else _CELLS.get(key)
    if cell is None:  # the floats as hex: under dynamic=True they are SymFloats, which .hex() specializes (guarded)
        cell = getattr(_MADE, _make_cell(kind, activation, key[2].hex(), key[3].hex()))
    return cell


@mark_constant_result
def _make_cell(kind: type[BlockGRUCell], activation, *floats: str) -> str:
    """The ``_MADE`` attribute of the cell of these hyperparameters (floats as hex), made unless it exists, for real
    even while Dynamo traces: its constants (:func:`_floats`) are read at trace time."""
    key = (kind, activation, *map(float.fromhex, floats))
    cell = _CELLS.get(key)
    if cell is None:
        if not (activation in ACTIVATIONS if isinstance(activation, str) else callable(activation)):
            raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)} or an elementwise callable (e.g. "
                             f"torch.sin, nn.Sigmoid()), got {activation!r}.")
        cell = _CELLS[key] = register(kind(activation, *key[2:]))
        setattr(_MADE, f"c{id(cell)}", cell)
    return f"c{id(cell)}"


BLOCK_GRU = block_gru_cell()  # the other activations' default cells: in .rssm, with the RSSM core's
