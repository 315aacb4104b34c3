"""Flat batches of whole slices under ``torch.compile`` with ``slice_len`` / ``recurrent_slice_len``.

With the hint a flat ``[N]`` batch runs as ``[N / slice_len, slice_len]`` with static shapes:
one graph, zero graph breaks, no dynamo flag. Checked against the eager ``reference`` loop
without the hint on outputs, final and segment states and gradients (fp64, ``assert_close``
defaults), with a reset inside a slice and stored reset states; the compiled check of
``is_init`` raises from the compiled call; ``num_slices`` runs truncated slices in a padded block;
the module path runs a real ``SliceSampler`` batch.
"""

from __future__ import annotations

import pytest
import torch
from compile_helpers import FAST, F_IN, H, as_parts, as_state, compile_stats, make_params
from tensordict import TensorDict

import rnn_functional as rf

SLICE, N = 4, 12  # three slices of four steps
SEQUENCE = {"lstm": rf.lstm_sequence, "gru": rf.gru_sequence}


def flat_call(cell: str, num_layers: int, proj: int):
    """Leaves and arguments of a flat call ``x [N, F]``: slice starts plus one reset inside a slice."""
    g = torch.Generator().manual_seed(7)
    params = make_params(cell, num_layers, proj, torch.float64)
    widths = (proj or H, H) if cell == "lstm" else (H,)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    x = rand(N, F_IN)
    state = tuple(rand(num_layers, w) for w in widths)
    reset = tuple(rand(N, num_layers, w) for w in widths)
    is_init = torch.zeros(N, dtype=torch.bool)
    is_init[::SLICE] = True
    is_init[6] = True
    return [x, *state, *reset, *params.values()], (x, state, params, is_init, reset)


def loss_fn(cell: str, **options):
    def fn(x, state, params, is_init, reset):
        y, final, seg = SEQUENCE[cell](x, as_state(cell, state), params, is_init=is_init,
                                       reset_state=as_state(cell, reset), return_segment_states=True, **options)
        outs = [y, *as_parts(cell, final), *as_parts(cell, seg)]
        return sum((o * (i + 1)).sum() + o.pow(2).sum() for i, o in enumerate(outs)), outs  # varied cotangents

    return fn


def outputs_and_grads(fn, leaves, args):
    loss, outs = fn(*args)
    return [o.detach() for o in outs], torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("cell,num_layers,proj,compiler", [("lstm", 1, 0, "inductor"), ("lstm", 2, 2, FAST)],
                         ids=["lstm-L1-inductor", "lstm-L2-proj2-aot_eager"])
def test_compiled_slices_match_reference(cell, num_layers, proj, compiler):
    leaves, args = flat_call(cell, num_layers, proj)
    fn = loss_fn(cell, slice_len=SLICE)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=compiler, fullgraph=True)
    with compile_stats() as stats:
        got = outputs_and_grads(compiled, leaves, args)
    want = outputs_and_grads(loss_fn(cell, backend="reference"), leaves, args)
    torch.testing.assert_close(got, want)
    assert (stats.graphs, stats.breaks) == (1, 0)

    # the hint is checked inside the compiled graph: a batch that is not whole slices raises
    bad = args[3].clone()
    bad[2 * SLICE] = False
    with compile_stats() as stats, pytest.raises(RuntimeError, match="slice_len: is_init must be True at every slice start"):
        compiled(*args[:3], bad, args[4])
    assert stats.graphs == 0  # same shapes, new values: no recompile


def test_compiled_ragged_slices_in_padded_block_match_reference():
    """``slice_len`` + ``num_slices`` (strict_length=False): truncated slices run in a static padded
    block. Batch lengths vary (as with strict_length=False): the second length recompiles once with
    ``N`` dynamic (automatic dynamic shapes), a third reuses that graph."""
    cell, layers = "gru", 2
    params = make_params(cell, layers, 0, torch.float64)
    fn = loss_fn(cell, slice_len=5, num_slices=6)
    compiled = torch.compile(fn, backend=FAST, fullgraph=True)
    g = torch.Generator().manual_seed(3)
    for lengths, graphs in (([4, 2, 5, 1, 5, 3], 1), ([5, 5, 3, 1], 1), ([5, 2, 3], 0)):  # N = 20, 14, 10
        n = sum(lengths)
        is_init = torch.zeros(n, dtype=torch.bool)
        is_init[torch.tensor([0] + lengths[:-1]).cumsum(0)] = True
        x = torch.randn(n, F_IN, generator=g, dtype=torch.float64).requires_grad_()
        state = (torch.randn(layers, H, generator=g, dtype=torch.float64).requires_grad_(),)
        reset = (torch.randn(n, layers, H, generator=g, dtype=torch.float64).requires_grad_(),)
        leaves, args = [x, *state, *reset, *params.values()], (x, state, params, is_init, reset)
        with compile_stats() as stats:  # fullgraph: a graph break raises; the graphs are counted here
            got = outputs_and_grads(compiled, leaves, args)
        torch.testing.assert_close(got, outputs_and_grads(loss_fn(cell, backend="reference"), leaves, args))
        assert (stats.graphs, stats.breaks) == (graphs, 0)
    too_many = torch.ones(n, dtype=torch.bool)  # 10 segments of one step: more than the bound of 6
    with compile_stats() as stats, pytest.raises(RuntimeError, match="expected at most num_slices segments"):
        compiled(x, state, params, too_many, reset)
    assert stats.graphs == 0


def sampled_batch(cell: str) -> TensorDict:
    """A flat batch drawn by ``SliceSampler(slice_len=SLICE, strict_length=True)`` from episodes of stored steps."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import SliceSampler

    g = torch.Generator().manual_seed(11)
    episodes = [7, 12, 9, 15]
    total = sum(episodes)
    starts = torch.tensor([0] + episodes[:-1]).cumsum(0)
    is_init = torch.zeros(total, 1, dtype=torch.bool)
    is_init[starts] = True
    done = torch.zeros(total, 1, dtype=torch.bool)
    done[torch.tensor(episodes).cumsum(0) - 1] = True
    data = {"obs": torch.randn(total, F_IN, generator=g, dtype=torch.float64), "is_init": is_init,
            ("collector", "traj_ids"): torch.repeat_interleave(torch.arange(len(episodes)), torch.tensor(episodes)),
            ("next", "done"): done}
    for key in (["h", "c"] if cell == "lstm" else ["h"]):
        data[key] = torch.randn(total, 1, H, generator=g, dtype=torch.float64)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(total), batch_size=N,
                                sampler=SliceSampler(slice_len=SLICE, strict_length=True,
                                                     traj_key=("collector", "traj_ids")))
    rb.extend(TensorDict(data, [total]))
    torch.manual_seed(0)
    return rb.sample()


@pytest.mark.parametrize("cell", ["lstm"])
def test_compiled_module_on_slice_sampler_batch(cell):
    """``LSTMModule(recurrent_slice_len=...)`` compiled on a real ``SliceSampler`` batch == the eager
    ``reference`` module without the hint: outputs, next states, grads of inputs and weights."""
    batch = sampled_batch(cell)
    assert tuple(batch.batch_size) == (N,) and batch["is_init"][::SLICE].all()
    keys = ["h", "c"]
    results = []
    for slice_len, backend, compiled in ((SLICE, "auto", True), (None, "reference", False)):
        torch.manual_seed(0)
        module = rf.LSTMModule(F_IN, H, in_keys=["obs", *keys], out_keys=["y", *[("next", k) for k in keys]],
                               recurrent_backend=backend, recurrent_slice_len=slice_len).double()
        run = torch.compile(module, backend=FAST, fullgraph=True) if compiled else module
        td = batch.select("obs", "is_init", *keys).clone()
        leaves = [td["obs"].requires_grad_(), *(td[k].requires_grad_() for k in keys)]
        with rf.set_recurrent_mode(True), compile_stats() as stats:
            out = run(td)
        outs = [out["y"], *(out["next", k] for k in keys)]
        loss = sum((o * (i + 1)).sum() for i, o in enumerate(outs))
        results.append(([o.detach() for o in outs], torch.autograd.grad(loss, [*leaves, *module.parameters()])))
        if compiled:
            assert (stats.graphs, stats.breaks) == (1, 0)
    torch.testing.assert_close(results[0], results[1])
