"""``MinGRUModule`` / ``RGLRUModule`` (issue 30): ``GRUModule``'s conventions, and a TorchRL pipeline that swaps
``GRUModule`` for either with no other change (collector -> ``SliceSampler`` buffer -> recurrent-mode PPO loss).

fp32 comparisons of recurrent mode (``parallel``, whole-sequence GEMM) against the collected steps (one GEMM per
step) use ``atol=1e-5, rtol=1e-4``: two summation orders over at most 96 steps of a hidden-8 network.
"""

from __future__ import annotations

import pytest
import torch
from module_helpers import cartpole_env
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

import rnn_functional as rf

MODULES = {"min_gru": (rf.MinGRUModule, rf.min_gru_sequence, "min_gru"), "rglru": (rf.RGLRUModule, rf.rglru_sequence, "rglru")}
TOL = dict(atol=1e-5, rtol=1e-4)
HIDDEN = 8


@pytest.mark.parametrize("cell", list(MODULES))
def test_conventions_of_gru_module(cell):
    """Keys, state shapes, primer and state-dict names; recurrent mode (TorchRL's context) equals the functional
    sequence from the stored states, and a step equals the functional step with a zero reset."""
    from torchrl.modules import set_recurrent_mode as trl_set_recurrent_mode

    module_class, sequence, child = MODULES[cell]
    torch.manual_seed(0)
    m = module_class(3, 5, num_layers=2, in_key="obs", out_key="feat").double()
    assert m.in_keys == ["obs", "recurrent_state", "is_init"] and m.out_keys == ["feat", ("next", "recurrent_state")]
    params = dict(getattr(m, child).named_parameters())
    assert all(k.startswith(f"{child}.") for k in m.state_dict()) and "weight_l1" in params
    primer = m.make_tensordict_primer()
    assert primer.primers["recurrent_state"].shape == (2, 5)
    td = TensorDict({"obs": torch.randn(4, 7, 3, dtype=torch.float64), "is_init": torch.rand(4, 7, 1) < 0.3,
                     "recurrent_state": torch.randn(4, 7, 2, 5, dtype=torch.float64)}, [4, 7])
    with trl_set_recurrent_mode(True):
        out = m(td.clone())
    y, _, seg = sequence(td["obs"], td["recurrent_state"][:, 0], params, is_init=td["is_init"],
                         reset_state=td["recurrent_state"], return_segment_states=True, backend="reference")
    torch.testing.assert_close(out["feat"], y)
    torch.testing.assert_close(out["next", "recurrent_state"], seg)
    step = m(td[:, 3].clone())
    y1, h1 = sequence(td["obs"][:, 3:4], torch.where(td["is_init"][:, 3, :, None], 0.0, td["recurrent_state"][:, 3]),
                      params, backend="reference")
    torch.testing.assert_close(step["feat"], y1[:, 0])
    torch.testing.assert_close(step["next", "recurrent_state"], h1)


@pytest.mark.parametrize("cell", list(MODULES))
def test_reset_parameters_redraws_in_place_as_the_constructor(cell):
    """``child.reset_parameters()`` (``nn.GRU``'s method, which init loops call) draws what the constructor draws from
    the same seed, into the same tensors (an optimizer holding them stays valid), keeping their dtype."""
    module_class, _, child = MODULES[cell]
    torch.manual_seed(0)
    m = module_class(3, 5, num_layers=2, in_key="obs", out_key="feat")
    before = {k: p.detach().clone() for k, p in m.named_parameters()}
    ids = {k: id(p) for k, p in m.named_parameters()}
    torch.manual_seed(1)
    getattr(m, child).reset_parameters()
    torch.manual_seed(1)
    fresh = module_class(3, 5, num_layers=2, in_key="obs", out_key="feat")
    for key, p in m.named_parameters():
        assert id(p) == ids[key] and not torch.equal(p, before[key]), key
        torch.testing.assert_close(p, fresh.get_parameter(key), rtol=0, atol=0)
    m.double()
    getattr(m, child).reset_parameters()
    assert all(p.dtype == torch.float64 for p in m.parameters())


def test_constructor_errors_and_backends():
    with pytest.raises(ValueError, match="bias=False is not offered"):
        rf.MinGRUModule(3, 5, bias=False, in_key="x", out_key="y")
    with pytest.raises(ValueError, match=r"backend 'pad' cannot serve the RG-LRU cell.*'parallel'"):
        rf.RGLRUModule(3, 5, in_key="x", out_key="y", recurrent_backend="pad")
    with pytest.raises(ValueError, match=r"backend 'parallel' cannot serve the GRU cell"):
        rf.GRUModule(3, 5, in_key="x", out_key="y", recurrent_backend="parallel")
    with pytest.raises(ValueError, match="make_cudnn_based.*no minGRU kernel"):
        rf.MinGRUModule(3, 5, in_key="x", out_key="y").make_cudnn_based()
    m = rf.RGLRUModule(3, 5, in_key="x", out_key="y", recurrent_backend="scan", python_based=True)
    assert m.recurrent_backend == "scan" and m.python_based


@pytest.mark.parametrize("cell", list(MODULES))
def test_constructor_errors_offer_only_fixes_that_exist(cell):
    # these modules take no built child (no min_gru= / rglru= argument, no torch.nn class to build one)
    module, child = MODULES[cell][0], MODULES[cell][2]
    for kwargs, missing in ((dict(hidden_size=4), "input_size"), (dict(input_size=3), "hidden_size")):
        with pytest.raises(TypeError, match=rf"^{module.__name__}: {missing} must be passed \(an int\), got None\.$"):
            module(**kwargs, in_key="x", out_key="y")
    with pytest.raises(ValueError, match=rf"^{module.__name__}: batch_first=False is not supported.*batch_first=True\.$") as err:
        module(3, 4, batch_first=False, in_key="x", out_key="y")
    assert f"{child}=" not in str(err.value) and "nn." not in str(err.value)


@pytest.mark.parametrize("cell", list(MODULES))
@pytest.mark.parametrize("recurrent", [False, True], ids=["step", "recurrent"])
def test_torch_export_equals_eager_and_leaves_the_module_real(cell, recurrent):
    """Non-strict ``torch.export`` (it swaps the parameters for fakes while it traces) of a keyword-tensor call: the
    program equals eager on inputs that differ in ``is_init``, and the module still returns real, equal tensors."""
    torch.manual_seed(0)
    m = MODULES[cell][0](3, 5, num_layers=2, in_key="obs", out_key="feat", default_recurrent_mode=recurrent)
    lead = (4, 6) if recurrent else (4,)
    g = torch.Generator().manual_seed(1)
    inputs = {"obs": torch.randn(*lead, 3, generator=g), "recurrent_state": torch.randn(*lead, 2, 5, generator=g),
              "is_init": torch.rand(*lead, 1, generator=g) < 0.4}
    flipped = {**inputs, "is_init": ~inputs["is_init"]}
    before = [m(**kw) for kw in (inputs, flipped)]
    exported = torch.export.export(m, args=(), kwargs=inputs, strict=False)
    for kw, want in zip((inputs, flipped), before):
        for got, again, ref in zip(exported.module()(**kw), m(**kw), want, strict=True):
            assert type(again) is torch.Tensor
            torch.testing.assert_close(got, ref)
            torch.testing.assert_close(again, ref)


# ----------------------------------------------------------------------------- a TorchRL pipeline, GRUModule swapped

pytest.importorskip("gymnasium")


def _policy(core_class) -> Seq:
    core = core_class(input_size=4, hidden_size=HIDDEN, in_key="observation", out_key="features")
    head = Mod(nn.Linear(HIDDEN, 2), in_keys=["features"], out_keys=["logits"])
    return Seq(core, head, Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]))


@pytest.mark.parametrize("core_class", [rf.GRUModule, rf.MinGRUModule, rf.RGLRUModule])
def test_collector_slice_sampler_and_ppo_loss_run_unchanged(core_class):
    """The same pipeline code for every core: collect (the collector registers the primer), sample flat
    ``SliceSampler`` slices, replay them in recurrent mode (equal to the collected features: each slice restarts
    from its stored state), train through TorchRL's ``ClipPPOLoss``."""
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import SliceSampler
    from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
    from torchrl.modules import set_recurrent_mode as trl_set_recurrent_mode
    from torchrl.objectives import ClipPPOLoss

    torch.manual_seed(0)
    policy = _policy(core_class)
    env = cartpole_env()
    env.set_seed(0)
    collector = Collector(env, policy, frames_per_batch=96, total_frames=96, auto_register_policy_transforms=True)
    data = next(iter(collector))
    collector.shutdown()
    assert data["recurrent_state"].shape == (96, 1, HIDDEN)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(256), sampler=SliceSampler(slice_len=8, strict_length=False),
                                batch_size=32)
    rb.extend(data)
    sample = rb.sample()
    with trl_set_recurrent_mode(True):
        replay = policy(sample.clone())
    torch.testing.assert_close(replay["features"], sample["features"], **TOL)

    core = policy[0]
    actor = ProbabilisticActor(Seq(core, policy[1]), in_keys=["logits"], distribution_class=OneHotCategorical,
                               return_log_prob=True)
    critic = ValueOperator(nn.Linear(4, 1), in_keys=["observation"])
    batch = sample.select("observation", "recurrent_state", "is_init", "next").clone()
    with trl_set_recurrent_mode(True), torch.no_grad():
        batch = actor(batch)
    batch["advantage"] = torch.randn(32, 1)
    batch["value_target"] = torch.randn(32, 1)
    losses = ClipPPOLoss(actor, critic)(batch.exclude("features", "logits"))
    sum(v for k, v in losses.items() if k.startswith("loss_")).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in core.parameters())
    torch.testing.assert_close(losses["kl_approx"], torch.zeros(()), atol=1e-5, rtol=0)
