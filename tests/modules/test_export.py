"""``torch.export`` and AOTInductor of whole recurrent policies in sequential mode (one env step per call).

Two policy layouts, each with an ``LSTMModule`` and a ``GRUModule``:

* ``batched``: ``TensorDictSequential(module, MLP head, argmax)`` over a ``[B]`` batch, the module
  with the keys of ``test_param_routes`` (``x``, ``h`` (, ``c``) -> ``y``, ``("next", h)`` ...).
* ``tutorial``: the layout of TorchRL's export tutorial: one unbatched step, a ``BatchSizeTransform``
  adding then removing a leading batch dim around an MLP encoder, the module (custom keys
  ``embed``, ``hidden0`` (, ``hidden1``) -> ``intermediate``, ``hidden0`` ...) and an MLP head, the
  outputs narrowed with ``select_out_keys``.

Policies are called with keyword tensors (tensordict's ``dispatch``) and exported with
``kwargs=``. Each exported policy is run on two inputs that differ in ``is_init``, so a reset that
export baked in as a constant would show. The eager policy must still return real tensors equal
to its outputs before the export (``test_param_routes`` explains how export once broke that).

AOTInductor compiles C++ on the CPU (~20-30 s per package on the CI's 2 cores): marked ``slow``,
which the CI's test command does not deselect.
"""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from test_param_routes import H, _inputs, _module

import rnn_functional as rf

pytest.importorskip("torchrl")
from torchrl.envs import BatchSizeTransform  # noqa: E402
from torchrl.modules import MLP  # noqa: E402

# Inductor's C++ kernels may fuse and re-associate float32 arithmetic: last-bit differences only
FP32_TOL = {"rtol": 1e-5, "atol": 1e-6}
OBS, EMBED, HIDDEN, LAYERS = 5, 6, 8, 2  # tutorial layout sizes
TUTORIAL_HIDDEN = {"lstm": ["hidden0", "hidden1"], "gru": ["hidden0"]}


def _batched_policy(cell: str):
    torch.manual_seed(0)
    head = Mod(MLP(in_features=H, out_features=2, num_cells=[8]), in_keys=["y"], out_keys=["logits"])
    act = Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    return Seq(_module(cell), head, act)


def _batched_inputs(cell: str) -> list[dict]:
    data = _inputs(cell)  # is_init [[True], [False]]
    return [data, {**data, "is_init": ~data["is_init"]}]


def _tutorial_policy(cell: str):
    torch.manual_seed(0)
    hidden = TUTORIAL_HIDDEN[cell]
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    rnn = cls(input_size=EMBED, hidden_size=HIDDEN, num_layers=LAYERS,
              in_keys=["embed", *hidden], out_keys=["intermediate", *hidden])
    policy = Seq(
        BatchSizeTransform(reshape_fn=lambda t: t.unsqueeze(0)),  # the module takes [*B] batches
        Mod(MLP(in_features=OBS, out_features=EMBED, num_cells=[16]), in_keys=["observation"], out_keys=["embed"]),
        rnn,
        Mod(MLP(in_features=HIDDEN, out_features=3, num_cells=[16]), in_keys=["intermediate"], out_keys=["action"]),
        BatchSizeTransform(reshape_fn=lambda t: t.squeeze(0)),
    )
    return policy.select_out_keys("action", *hidden)


def _tutorial_inputs(cell: str) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    data = {"observation": torch.randn(OBS, generator=g)}
    data.update({k: torch.randn(LAYERS, HIDDEN, generator=g) for k in TUTORIAL_HIDDEN[cell]})
    return [{**data, "is_init": torch.tensor(flag)} for flag in (False, True)]


LAYOUTS = {"batched": (_batched_policy, _batched_inputs), "tutorial": (_tutorial_policy, _tutorial_inputs)}


def _assert_outputs(got, want, **tol) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert type(a) is torch.Tensor, f"got a {type(a).__name__}"
        torch.testing.assert_close(a, b, **tol)


def _export(layout: str, cell: str, strict: bool):
    """The policy, its inputs, its eager outputs before the export, and the exported program."""
    make_policy, make_inputs = LAYOUTS[layout]
    policy, inputs = make_policy(cell), make_inputs(cell)
    before = [policy(**kw) for kw in inputs]
    assert not before[0][0].equal(before[1][0])  # is_init changes the step
    exported = torch.export.export(policy, args=(), kwargs=inputs[0], strict=strict)
    return policy, inputs, before, exported


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_export_policy_step(cell, layout, strict):
    """The exported program equals the eager policy; the eager policy is unchanged by the export."""
    policy, inputs, before, exported = _export(layout, cell, strict)
    for kw, want in zip(inputs, before):
        _assert_outputs(exported.module()(**kw), want)
    for kw, want in zip(inputs, before):
        _assert_outputs(policy(**kw), want)


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["lstm"])
def test_aoti_package_policy_step(cell, tmp_path):
    """The tutorial layout exported (non-strict, as the tutorial does), compiled with AOTInductor into a
    package, loaded back: its calls equal the eager policy's, and the eager policy is unchanged. The LSTM (two state
    keys) only: the GRU's program is exported and run in test_export_policy_step, and Inductor's code for its step
    is compiled in compile_tests/test_compile_as_called.py."""
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    policy, inputs, before, exported = _export("tutorial", cell, strict=False)
    with torch.no_grad():
        path = aoti_compile_and_package(exported, package_path=str(tmp_path / f"{cell}_policy.pt2"))
    compiled = aoti_load_package(path)
    for kw, want in zip(inputs, before):
        _assert_outputs(compiled(**kw), want, **FP32_TOL)
    for kw, want in zip(inputs, before):
        _assert_outputs(policy(**kw), want)
