"""What a cell is (:class:`Cell`, the interface every backend talks to), and the cell-independent math they share.
Shapes: ``N`` flattened batch, ``T`` time, ``L`` layers, ``S`` a state width. A carry is a tuple of state tensors,
``[N, S]`` per layer or ``[N, L, S]`` for the stack; its first entry ``h`` is also the layer's output."""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from tensordict import TensorDict

Carry = tuple[torch.Tensor, ...]
Saved = tuple[torch.Tensor, ...]  # a step's activations kept for its backward (see Cell.layer_step_saving)


@dataclass(unsafe_hash=True, slots=True)  # not frozen: a frozen init is slower, and every call reads a layout
class Layout:
    """Static description of a stack of layers of one cell, read from its params (treat as immutable)."""

    cell: Cell
    num_layers: int
    input_size: int
    hidden_size: int
    state_sizes: tuple[int, ...]  # width of each carry entry; the first is the output width
    dtype: torch.dtype
    device: torch.device
    bias: bool = False
    proj_size: int = 0  # 0 when the cell has no output projection

    @property
    def out_size(self) -> int:
        """Width of the layer output (``h``): ``P`` for a projected LSTM, else ``H``."""
        return self.state_sizes[0]


@dataclass(unsafe_hash=True, slots=True)  # not frozen, as Layout: a step builds one per layer
class LayerWeights:
    """One layer's weights (absent ones ``None``): ``gi = x @ weight_ih^T + bias_ih`` is the input projection (for all
    steps at once), ``gh = h @ weight_hh^T + bias_hh`` the recurrent one; ``extra``: the cell's other weights."""

    weight_ih: torch.Tensor
    bias_ih: torch.Tensor | None
    weight_hh: torch.Tensor
    bias_hh: torch.Tensor | None
    extra: tuple[torch.Tensor | None, ...] = ()

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """All weights in a fixed order, for :meth:`from_tensors`."""
        return (self.weight_ih, self.bias_ih, self.weight_hh, self.bias_hh, *self.extra)

    @classmethod
    def from_tensors(cls, tensors) -> LayerWeights:
        """Inverse of :meth:`tensors`."""
        return cls(*tensors[:4], extra=tuple(tensors[4:]))


class StepGrads(NamedTuple):
    """What a cell's hand-written step backward returns (see :meth:`Cell.step_backward`)."""

    d_carry: Carry  # cotangent of the carry before the step
    d_gi: torch.Tensor  # cotangent of the input projection gi [N, G]
    d_gh: torch.Tensor | None  # cotangent of the recurrent projection gh; None: equal to d_gi
    d_extra: tuple[torch.Tensor | None, ...]  # what Cell.reduce_extra_grads turns into the gradients of ``extra``


@dataclass(frozen=True)
class AtenKernels:
    """ATen's fused kernels for a cell (``pad`` backend): ``sequence(layout, params, inputs, hx, dropout, training,
    batch_sizes) -> (out, hx')`` runs all layers over ``inputs [N, T, F]`` (or packed data with ``batch_sizes``), ``hx``
    a carry of ``[L, N, S]``; ``step(w, x [N, F], carry) -> carry`` one layer one step, unprojected. ``fused_on_cpu``:
    an unpacked ``sequence`` is one fused kernel on CPU (oneDNN's LSTM, not its GRU); ``auto``'s eager rule reads it."""

    sequence: Callable
    step: Callable
    fused_on_cpu: bool = False


@dataclass(frozen=True)
class TritonKernels:
    """The ``triton`` kernel family serving a cell: ``is_lstm`` selects its gate and state update."""

    is_lstm: bool


class Cell(abc.ABC):
    """A recurrent cell kind. One subclass instance per cell file."""

    name: str  # identifier, e.g. "lstm"
    title: str  # in messages and docs, e.g. "LSTM"
    state_names: tuple[str, ...] = ("h",)  # carry entries; the first, h, is also the output
    state_doc: str = "``h [*B, L, H]``"  # the public state format, e.g. "``(h [*B, L, P], c [*B, L, H])``"
    params_doc: str  # what a params TensorDict holds, for messages and docs
    init_function: str  # the public init function's name, for messages
    out_dim: str = "H"  # the output width's symbol in docs
    aten: AtenKernels | None = None
    triton: TritonKernels | None = None
    linear_in_state: bool = False  # h' = a * h + b with (a, b) from the input alone (the ``parallel`` backend's cells)
    # the step also reads ``start`` (bool, True where ``is_init``), passed last to layer_step(_saving) (``[N, 1]``),
    # step_backward and coefficients (``[..., 1]``); step_backward_saved finds it among the saved activations
    reads_starts: bool = False

    @abc.abstractmethod
    def read_layout(self, params: Mapping[str, torch.Tensor]) -> Layout:
        """Validate ``params`` (keys, shapes, dtype, device) and return their layout; ``KeyError``/``ValueError``
        name the key, the expected and the actual value."""

    def layout_of(self, params: Mapping[str, torch.Tensor], known: Layout | None) -> Layout:
        """``known`` (the layout a module checked its weights against when bound) while the params' dtype, device, sizes
        and layer count still match it (``.to()``, ``to_module`` swap them in place); else :meth:`read_layout`."""
        return self.read_layout(params)

    @abc.abstractmethod
    def layer_weights(self, params: Mapping[str, torch.Tensor], layout: Layout, k: int) -> LayerWeights:
        """Weights of layer ``k``."""

    @abc.abstractmethod
    def layer_step_saving(self, gi: torch.Tensor, carry: Carry, w: LayerWeights) -> tuple[Carry, Saved]:
        """One layer, one step: ``gi [N, G]`` (the input projection), carry of ``[N, S]`` -> ``(carry', saved)``,
        ``saved`` the ``[N, ·]`` activations :meth:`step_backward_saved` consumes."""

    def backward_factors(self, saved: Saved, carry: Carry, w: LayerWeights) -> Saved:
        """What :meth:`step_backward_saved` reads, from a step's ``saved`` and the carry before it; elementwise only,
        so it also runs on many steps at once (``[T, N, ·]``). Default: ``saved`` unchanged."""
        return saved

    @abc.abstractmethod
    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        """Backward of one step from its :meth:`backward_factors` (no forward matmul redone): ``carry`` is the carry
        before the step, ``d_new`` the cotangent of the carry after it."""

    # ``prepare_input(params, x) -> x``: the first layer's input from the call's ``x [..., F]`` for every step at once,
    # before any backend runs (the block GRU's normalised projection); ``None``: ``x`` as it is.
    prepare_input: Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor] | None = None

    def reduce_extra_grads(self, *per_step: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The present ``extra`` weights' gradients from every step's non-``None`` ``d_extra``, stacked over time
        (``[T, ...]``). Default: summed over time; a cell may emit per-row factors and reduce them here in one GEMM."""
        return tuple([d.sum(0) for d in per_step])

    def layer_step(self, gi: torch.Tensor, carry: Carry, w: LayerWeights, *start: torch.Tensor) -> Carry:
        """:meth:`layer_step_saving` without what it saves (``start``: see :attr:`reads_starts`)."""
        return self.layer_step_saving(gi, carry, w, *start)[0]

    def carry_rest_given_h(self, gi: torch.Tensor, h_prev: torch.Tensor, rest0: Carry, w: LayerWeights) -> Carry:
        """The carry's parts after ``h`` at every step, given ``gi [R, T, G]``, ``h_prev [R, T, P]`` (``h`` before each
        step) and ``rest0`` (those parts before step 0, ``[R, S]`` each) -> tuple of ``[R, T, S]``."""
        carry, rest = rest0, []
        for gi_t, h_t in zip(gi.unbind(1), h_prev.unbind(1)):  # not [:, t]: see backends/reference.py
            carry = self.layer_step(gi_t, (h_t, *carry), w)[1:]
            rest.append(carry)
        return tuple([torch.stack(parts, dim=1) for parts in zip(*rest)])

    def step_backward(self, gi: torch.Tensor, carry: Carry, w: LayerWeights, d_new: Carry,
                      *start: torch.Tensor) -> StepGrads:
        """Backward of :meth:`layer_step`, recomputing its activations (``d_new``: see :meth:`step_backward_saved`)."""
        factors = self.backward_factors(self.layer_step_saving(gi, carry, w, *start)[1], carry, w)
        return self.step_backward_saved(factors, carry, w, d_new)

    def __repr__(self) -> str:
        return f"<{self.title} cell>"


CELLS: dict[str, Cell] = {}  # every cell by name (the compiled ensemble op names its cell: op schemas hold no objects)


def register(cell: Cell) -> Cell:
    """Make ``cell`` known by its name; each cell file registers the cells it makes."""
    CELLS[cell.name] = cell
    return cell


# ----------------------------------------------------------------------------- shared math


def apply_reset(carry: Carry, mask: torch.Tensor | None, reset: Carry | None) -> Carry:
    """``carry`` replaced by ``reset`` (or zeros) where ``mask`` (the carry tensors' leading dims) is True."""
    if mask is None:
        return carry
    missing = carry[0].ndim - mask.ndim  # every carry tensor has the same ndim; a view fits any strides
    mask = mask.view(*mask.shape, *(1,) * missing) if missing else mask
    out = []
    for i, s in enumerate(carry):  # a loop, not a comprehension: one frame fewer per call (benchmarks/walk.py)
        out.append(torch.where(mask, 0.0 if reset is None else reset[i], s))
    return tuple(out)


def keep_segment_ends(states: Carry, is_init: torch.Tensor) -> Carry:
    """Per-step carries ``[N, T, L, S]`` zeroed except at segment ends (before a reset, and at ``T - 1``: TorchRL's
    ``("next", hidden)``); ``is_init [N, T]``."""
    if torch.compiler.is_compiling():
        # traced, ``pad``'s decomposition guards ``T - 1 != 1``: an export with a dynamic T refused T = 2
        last = torch.arange(is_init.shape[-1], device=is_init.device) == is_init.shape[-1] - 1
        ends = is_init.roll(-1, -1) | last
    else:
        ends = F.pad(is_init[:, 1:], (0, 1), value=True)  # one op eagerly: the next step's reset, True past the end
    ends = ends.view(*ends.shape, *(1,) * (states[0].ndim - ends.ndim))  # every carry has the same ndim
    out = []
    for s in states:  # a loop, as apply_reset's
        out.append(torch.where(ends, s, 0.0))
    return tuple(out)


def final_at_last_step(final: Carry, t_len: int) -> Carry:
    """:func:`keep_segment_ends` of a call without interior resets, from its final carry ``[N, L, S]`` alone."""
    before = (0, 0) * (final[0].ndim - 1) + (t_len - 1, 0)  # F.pad lists the last dim first
    return tuple([F.pad(s.unsqueeze(1), before) for s in final])


def between_layers(y: torch.Tensor, dropout: float, training: bool) -> torch.Tensor:
    """Dropout on a layer's output that the next layer reads (``torch.nn.LSTM``'s rule: in training only); the
    callers call it before every layer but the first, so a one-layer call never does."""
    return F.dropout(y, dropout, training=True) if dropout > 0 and training else y


def multi_layer_step(layout: Layout, params: Mapping[str, torch.Tensor], x: torch.Tensor, carry: Carry,
                     dropout: float = 0.0, training: bool = False,
                     start: torch.Tensor | None = None) -> tuple[torch.Tensor, Carry]:
    """All layers of ``layout.cell`` for one step. ``x [N, F]``, carry tensors ``[N, L, S]``; ``start [N, 1]``
    (bool, True where the step starts a segment) for a cell that reads it (:attr:`Cell.reads_starts`)."""
    cell = layout.cell
    new_layers: list[Carry] = []
    inp = x
    starts = () if start is None else (start,)
    for k in range(layout.num_layers):
        inp = between_layers(inp, dropout, training) if k else inp
        w = cell.layer_weights(params, layout, k)
        gi = F.linear(inp, w.weight_ih, w.bias_ih)
        layer_carry = cell.layer_step_saving(gi, tuple([s[:, k] for s in carry]), w, *starts)[0]
        new_layers.append(layer_carry)
        inp = layer_carry[0]
    return inp, tuple([torch.stack(parts, dim=1) for parts in zip(*new_layers)])


def uniform_(shape: tuple[int, ...], bound: float, dtype, device, generator) -> torch.Tensor:
    """A new tensor uniform in ``[-bound, bound]`` (``torch.nn.LSTM``'s initialisation)."""
    return torch.empty(shape, dtype=dtype, device=device).uniform_(-bound, bound, generator=generator)


def check_sizes(input_size: int, hidden_size: int, num_layers: int) -> None:
    """Raise ``ValueError`` unless all three are positive."""
    if input_size <= 0 or hidden_size <= 0 or num_layers <= 0:
        raise ValueError(f"input_size, hidden_size and num_layers must be positive, got input_size={input_size}, "
                         f"hidden_size={hidden_size}, num_layers={num_layers}.")


def count_layers(keys, kinds: tuple[str, ...], cell: Cell) -> int:
    """How many consecutive layers ``kinds[0].format(k=0, 1, ...)`` name; ``KeyError`` if none, or unless the keys
    are exactly every ``kind.format(k=k)``."""
    num_layers = 0
    while kinds[0].format(k=num_layers) in keys:
        num_layers += 1
    if num_layers == 0:
        raise KeyError(f"params: missing key {kinds[0].format(k=0)!r}; expected {cell.params_doc}, got {sorted(keys)}. "
                       f"Build them with {cell.init_function}(...).")
    expected = {kind.format(k=k) for k in range(num_layers) for kind in kinds}
    check_keys(keys, expected, f"a {num_layers}-layer {cell.title}")
    return num_layers


def check_keys(keys, expected: set[str], what: str) -> None:
    """Raise ``KeyError`` naming the missing or unexpected keys of a params dict."""
    missing, extra = expected - keys, keys - expected
    if missing:
        raise KeyError(f"params: missing key(s) {sorted(missing)} for {what}; got keys {sorted(keys)}.")
    if extra:
        raise KeyError(f"params: unexpected key(s) {sorted(extra)} for {what}; expected exactly {sorted(expected)}.")


def check_shapes(params, want: dict[str, tuple[int, ...]], sizes: str, first: str) -> None:
    """Raise ``ValueError`` unless each ``params[key]`` has shape ``want[key]`` and ``params[first]``'s dtype/device."""
    dtype, device = params[first].dtype, params[first].device
    for key, shape in want.items():
        t = params[key]
        if tuple(t.shape) != shape:
            raise ValueError(f"params[{key!r}]: expected shape {list(shape)} for {sizes}; got {list(t.shape)}. "
                             f"Are these params of another cell kind or of a differently sized model?")
        if t.dtype != dtype or t.device != device:
            raise ValueError(f"params[{key!r}]: all params must share dtype and device; {first} is {dtype} on "
                             f"{device}, {key} is {t.dtype} on {t.device}. Convert with params.to(...).")


# ----------------------------------------------------------------------------- torch.nn's layout

_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
# layer k's keys formatted once (every call reads them); a plain tuple, which Dynamo reads as a constant
_NAMES = tuple(tuple(f"{kind}_l{k}" for kind in _KINDS) for k in range(16))
_EXPECTED: dict[tuple, tuple[frozenset[str], tuple[tuple[str, tuple[int, ...]], ...]]] = {}


def _names(k: int) -> tuple[str, ...]:
    """Layer ``k``'s keys: ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``, ``weight_hr``."""
    return _NAMES[k] if k < len(_NAMES) else tuple(f"{kind}_l{k}" for kind in _KINDS)


def _expected(signature: tuple) -> tuple[frozenset[str], tuple[tuple[str, tuple[int, ...]], ...]]:
    """Every key of params with this layout ``(num_gates, num_layers, bias, proj_size, hidden, input_size)``, and each
    key with its shape; kept for the next call (eagerly: Dynamo would trace the store)."""
    num_gates, num_layers, bias, proj_size, hidden, input_size = signature
    out, gates = proj_size or hidden, num_gates * hidden
    want: list[tuple[str, tuple[int, ...]]] = []
    for k in range(num_layers):
        ih, hh, bih, bhh, hr = _names(k)
        want += [(ih, (gates, input_size if k == 0 else out)), (hh, (gates, out))]
        if bias:
            want += [(bih, (gates,)), (bhh, (gates,))]
        if proj_size:
            want.append((hr, (proj_size, hidden)))
    found = (frozenset(key for key, _ in want), tuple(want))
    if not torch.compiler.is_compiling():
        _EXPECTED[signature] = found
    return found


class TorchRNNCell(Cell):
    """A cell with ``torch.nn.LSTM``'s parameter names and layout (LSTM, GRU: ``num_gates`` blocks of H rows)."""

    projection: bool = False

    def init_params(self, input_size: int, hidden_size: int, num_layers: int, bias: bool, proj_size: int,
                    dtype: torch.dtype | None, device, generator: torch.Generator | None) -> TensorDict:
        """Params with ``torch.nn`` names, uniform in ``[-1/sqrt(H), 1/sqrt(H)]`` like ``torch.nn.LSTM``."""
        check_sizes(input_size, hidden_size, num_layers)
        if proj_size < 0 or (proj_size and proj_size >= hidden_size):
            raise ValueError(f"proj_size must be 0 (no projection) or in [1, hidden_size={hidden_size}), got {proj_size}.")
        bound = 1.0 / math.sqrt(hidden_size)
        _, want = _expected((self.num_gates, num_layers, bias, proj_size, hidden_size, input_size))  # torch.nn's order
        tensors = {key: uniform_(shape, bound, dtype, device, generator) for key, shape in want}
        return TensorDict(tensors, batch_size=[], device=device)

    def read_layout(self, params: Mapping[str, torch.Tensor]) -> Layout:
        keys, num_layers = params.keys(), 0
        while (_NAMES[num_layers][0] if num_layers < 16 else f"weight_ih_l{num_layers}") in keys:
            num_layers += 1
        if not num_layers:
            count_layers(keys, ("weight_ih_l{k}",), self)  # raises, naming the missing key
        bias, proj = "bias_ih_l0" in keys, "weight_hr_l0" in keys
        if proj and not self.projection:
            raise ValueError(f"params: 'weight_hr_l0' is an LSTM projection weight; {self.title} has no proj_size.")
        w_hh0 = params["weight_hh_l0"]
        if w_hh0.ndim != 2 or w_hh0.shape[0] % self.num_gates:
            raise ValueError(f"params['weight_hh_l0']: expected shape [{self.num_gates} * hidden_size, P] for "
                             f"{self.title}, got {tuple(w_hh0.shape)}. Are these params of another cell kind?")
        hidden, input_size = w_hh0.shape[0] // self.num_gates, params["weight_ih_l0"].shape[-1]
        proj_size = params["weight_hr_l0"].shape[0] if proj else 0
        signature = (self.num_gates, num_layers, bias, proj_size, hidden, input_size)
        # traced, no table read: a guard on a missing key recompiles once an eager call stores it
        compiling = torch.compiler.is_compiling()
        expected, want = _expected(signature) if compiling else _EXPECTED.get(signature) or _expected(signature)
        if keys != expected:  # one comparison in C for a dict's keys; other mappings take the detailed check
            check_keys(set(keys), expected, f"a {num_layers}-layer {self.title} (bias={bias}, proj={proj})")
        dtype, device = w_hh0.dtype, w_hh0.device
        for key, shape in want:
            t = params[key]
            if t.shape != shape or t.dtype != dtype or t.device != device:  # raises, naming the key and both values
                check_shapes(params, dict(want), f"{self.title} with hidden_size={hidden}, P={proj_size or hidden}, "
                             f"input_size={input_size}", "weight_hh_l0")
        state_sizes = (proj_size or hidden, hidden) if len(self.state_names) == 2 else (hidden,)
        return Layout(self, num_layers, input_size, hidden, state_sizes, dtype, device, bias, proj_size)

    def layout_of(self, params: Mapping[str, torch.Tensor], known: Layout | None) -> Layout:
        weight, w_in = params.get("weight_hh_l0"), params.get("weight_ih_l0")
        if (known is None or weight is None or w_in is None or weight.dtype != known.dtype
                or weight.device != known.device or w_in.shape[-1] != known.input_size
                or weight.shape[-1] != known.state_sizes[0] or weight.shape[0] != self.num_gates * known.hidden_size
                or f"weight_hh_l{known.num_layers - 1}" not in params or f"weight_hh_l{known.num_layers}" in params):
            return self.read_layout(params)
        return known

    def layer_weights(self, params: Mapping[str, torch.Tensor], layout: Layout, k: int) -> LayerWeights:
        """Weights of layer ``k``; ``extra`` is ``(weight_hr,)`` for a cell with ``projection``, else empty."""
        ih, hh, bih, bhh, hr = _NAMES[k] if k < 16 else _names(k)
        bias = layout.bias
        extra = (params[hr] if layout.proj_size else None,) if self.projection else ()
        return LayerWeights(params[ih], params[bih] if bias else None, params[hh], params[bhh] if bias else None, extra)


def torch_aten_sequence(layout: Layout, params, inputs, hx: Carry, dropout: float, training: bool, batch_sizes):
    """:attr:`AtenKernels.sequence` of a :class:`TorchRNNCell`: ``torch._VF.lstm``/``gru`` (named as the cell) with
    the weights in ``torch.nn.LSTM``'s ``_flat_weights`` order."""
    flat = []
    for k in range(layout.num_layers):
        ih, hh, bih, bhh, hr = _NAMES[k] if k < 16 else _names(k)
        flat += [params[ih], params[hh], params[bih], params[bhh]] if layout.bias else [params[ih], params[hh]]
        if layout.proj_size:
            flat.append(params[hr])
    kernel, state = getattr(torch._VF, layout.cell.name), hx if len(hx) > 1 else hx[0]
    args = (flat, layout.bias, layout.num_layers, dropout, training, False)
    out = kernel(inputs, state, *args, True) if batch_sizes is None else kernel(inputs, batch_sizes, state, *args)
    return out[0], tuple(out[1:])
