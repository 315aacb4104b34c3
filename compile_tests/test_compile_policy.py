"""torch.compile(policy, fullgraph=True) of whole recurrent policies built from our modules.

``policy = TensorDictSequential(LSTMModule | GRUModule, MLP head, argmax action)`` in
sequential mode (one env step, ``[B]``), in recurrent mode on a ``[B, T]`` batch and on a flat
ragged ``[N]`` batch (trajectories packed along the only batch dim, as SliceSampler yields them).
Forward and the backward of a loss run through the compiled graph; outputs and parameter grads
equal the eager policy's (which runs the eager backends: pad / reference / ATen step cells).
TorchRL's modules graph-break on the same policies.
"""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

import rnn_functional as rf

from compile_helpers import (
    FAST,
    FP32_TOL,
    H,
    POLICY_MODES,
    call_policy,
    compile_stats,
    hidden_keys,
    make_policy,
    policy_input,
    policy_loss,
)

def _outputs(out, cell):
    return [out["feat"], out["logits"], out["action"], *(out["next", k] for k in hidden_keys(cell))]


def _check_policy(cell, mode, backend, compiler):
    policy = make_policy(cell, backend)
    td = policy_input(cell, mode)
    params = list(policy.parameters())

    want = call_policy(policy, td, mode)
    want_grads = torch.autograd.grad(policy_loss(want, cell), params)
    compiled = torch.compile(policy, fullgraph=True, backend=compiler)
    with compile_stats() as stats:
        got = call_policy(compiled, td, mode)
        got_grads = torch.autograd.grad(policy_loss(got, cell), params)
    assert stats.breaks == 0 and stats.graphs == 1, stats
    for a, b in zip(_outputs(got, cell), _outputs(want, cell)):
        torch.testing.assert_close(a, b, **FP32_TOL)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, **FP32_TOL)


# recurrent_backend="pad" once: a step never reads it, and under compile it runs scan, as auto does (the routing:
# test_compile_functional.py::test_sequence_named_backend_fullgraph_fwd_bwd_fp64)
POLICY_CASES = [*((cell, mode, "auto") for cell in ("lstm", "gru") for mode in POLICY_MODES), ("lstm", "batch", "pad")]


@pytest.mark.parametrize(("cell", "mode", "backend"), POLICY_CASES)
def test_policy_fullgraph_fwd_bwd(cell, mode, backend):
    """One graph, no break, forward and loss backward equal to the eager policy (recurrent_backend auto and pad)."""
    _check_policy(cell, mode, backend, FAST)


@pytest.mark.parametrize("mode", ["step", "batch"])
def test_policy_inductor(mode):
    """The LSTM policy under Inductor (torch.compile's default), collection step and training batch."""
    _check_policy("lstm", mode, "auto", "inductor")


def test_policy_mode_switch_recompiles_once_per_mode():
    """One compiled policy serves both modes: switching set_recurrent_mode adds exactly one graph per mode."""
    policy = make_policy("lstm")
    compiled = torch.compile(policy, fullgraph=True, backend=FAST)
    step_td, batch_td = policy_input("lstm", "step"), policy_input("lstm", "batch")
    with compile_stats() as stats:
        for _ in range(2):
            for mode, td in (("step", step_td), ("batch", batch_td)):
                got = call_policy(compiled, td, mode)
                torch.testing.assert_close(got["logits"], call_policy(policy, td, mode)["logits"], **FP32_TOL)
    assert stats.breaks == 0 and stats.graphs == 2, stats


def _mode_context(kind: str):
    """``set_recurrent_mode`` of ``kind``: ours or TorchRL's (both drive our modules)."""
    if kind == "ours":
        return rf.set_recurrent_mode
    from torchrl.modules import set_recurrent_mode

    return set_recurrent_mode


def _compiled_recurrent_call(policy, kind: str, td: TensorDict) -> TensorDict:
    """A compiled function entering ``set_recurrent_mode(True)`` around a recurrent-mode (``scan``) policy call."""
    enter = _mode_context(kind)

    def train_forward(td):
        with enter(True):
            return policy(td)

    return torch.compile(train_forward, fullgraph=True, backend=FAST)(td.clone())


@pytest.fixture
def reset_mode_mirrors():
    """After the test, an eager context rewrites both flags' compile-time mirrors: TorchRL's may have
    leaked (see below) and would put later compiled calls of this process in recurrent mode."""
    yield
    with rf.set_recurrent_mode(None):
        pass


@pytest.mark.usefixtures("reset_mode_mirrors")
@pytest.mark.parametrize("kind", ["ours", "torchrl"])
def test_mode_context_inside_compiled_code_leaves_eager_calls_sequential(kind):
    """After a compiled call that enters ``set_recurrent_mode(True)`` (ours or TorchRL's), eager code sees
    no mode: ``recurrent_mode()`` is None, the module is in sequential mode and a step equals the one before."""
    policy = make_policy("lstm")
    batch_td, step_td = policy_input("lstm", "batch"), policy_input("lstm", "step")
    want_step = policy(step_td.clone())  # eager, no context: sequential mode
    want_batch = call_policy(policy, batch_td, "batch")["logits"]
    got = _compiled_recurrent_call(policy, kind, batch_td)
    torch.testing.assert_close(got["logits"], want_batch, **FP32_TOL)
    assert got["feat"].shape == (*batch_td.batch_size, H)
    # no eager set_recurrent_mode from here on: an eager context would reset the flags and hide a leak
    assert rf.recurrent_mode() is None and policy[0].recurrent_mode is False
    out = policy(step_td.clone())
    assert type(out["feat"]) is torch.Tensor and out["feat"].shape == (*step_td.batch_size, H)
    for key in ("feat", "logits", "action", *(("next", k) for k in hidden_keys("lstm"))):
        torch.testing.assert_close(out[key], want_step[key])


@pytest.mark.parametrize("kind", ["ours", "torchrl"])
@pytest.mark.usefixtures("reset_mode_mirrors")
def test_mode_context_inside_compiled_code_is_restored(kind):
    """``set_recurrent_mode(True)`` entered and exited inside compiled code around a recurrent-mode
    (``scan``) call leaves no mode behind: a policy compiled afterwards runs in sequential mode. With TorchRL's
    context too: torch 2.13 and 2.14 drop TorchRL's restoring attribute write after our ``scan``
    (pytorch/pytorch#195866), and our modules read their thread's mirror of TorchRL's flag, a dict entry."""
    policy = make_policy("lstm")
    batch_td, step_td = policy_input("lstm", "batch"), policy_input("lstm", "step")
    want_batch = call_policy(policy, batch_td, "batch")["logits"]
    want_step = call_policy(policy, step_td, "step")["logits"]
    # no eager set_recurrent_mode from here on: an eager context would reset the flag and hide a leak
    got = _compiled_recurrent_call(policy, kind, batch_td)
    out = torch.compile(policy, fullgraph=True, backend=FAST)(step_td.clone())  # no context: sequential mode
    torch.testing.assert_close(got["logits"], want_batch, **FP32_TOL)
    torch.testing.assert_close(out["logits"], want_step, **FP32_TOL)


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
])
def test_policy_step_fed_its_own_state_compiles_once(device):
    """A collector's loop: the compiled sequential-mode step (on CUDA with mode='reduce-overhead', CUDA graphs) fed
    its own next state under no_grad, with a reset on one step, equals eager and compiles one graph. (Fed state
    that requires grad, outside no_grad, Dynamo rightly recompiles once: its guards include requires_grad.) On CPU
    the recompiles are Dynamo's guards, which ``aot_eager`` counts (Inductor: test_policy_inductor)."""
    policy = make_policy("lstm", device=device)
    compiled = (torch.compile(policy, mode="reduce-overhead", fullgraph=True) if device == "cuda"
                else torch.compile(policy, fullgraph=True, backend=FAST))
    td = policy_input("lstm", "step", batch=4, device=device)
    eager_td = td.clone()
    with compile_stats() as stats, torch.no_grad():
        for t in range(6):  # warm-up, recording, then replays of the CUDA graph
            got = call_policy(compiled, td, "step")
            want = call_policy(policy, eager_td, "step")
            torch.testing.assert_close(got["logits"], want["logits"], **FP32_TOL)
            for key in hidden_keys("lstm"):  # the next step starts from this one's state
                td[key] = got["next", key].clone()
                eager_td[key] = want["next", key]
            td["is_init"] = torch.full_like(td["is_init"], t == 2)
            eager_td["is_init"] = td["is_init"].clone()
    assert stats.breaks == 0 and stats.graphs == 1, stats


def test_policy_does_not_recompile_when_modules_are_imported():
    """Reading TorchRL's recurrent-mode flag must not guard on ``sys.modules`` (every import,
    Inductor's own included, would then force a recompile of the policy)."""
    import importlib
    import sys

    import torchrl.modules.tensordict_module.rnn  # noqa: F401 - TorchRL loaded: its flag is read

    module = rf.LSTMModule(input_size=3, hidden_size=4, in_key="obs", out_key="y")
    td = TensorDict({"obs": torch.randn(5, 3), "is_init": torch.zeros(5, 1, dtype=torch.bool)}, [5])
    policy = torch.compile(module, fullgraph=True, backend="eager")
    policy(td.copy())
    sys.modules.pop("xml.dom.minidom", None)
    importlib.import_module("xml.dom.minidom")  # a module imported after the first compile
    with torch._dynamo.config.patch(error_on_recompile=True):
        policy(td.copy())


@pytest.mark.usefixtures("reset_mode_mirrors")
def test_mode_contexts_of_two_threads_stay_apart_in_compiled_calls():
    """An actor thread in ``set_recurrent_mode(False)`` and a learner thread in ``set_recurrent_mode(True)``,
    both calling one compiled policy: each call runs in its own thread's mode (the compile-time mirror of the
    flag is per thread; a single shared one ran the learner's batch in the actor's sequential mode)."""
    policy = make_policy("lstm")
    batch_td, step_td = policy_input("lstm", "batch"), policy_input("lstm", "step")
    want_batch = call_policy(policy, batch_td, "batch")["logits"]
    want_step = call_policy(policy, step_td, "step")["logits"]
    compiled = torch.compile(policy, fullgraph=True, backend=FAST)
    learner_in, actor_in, learner_done = threading.Event(), threading.Event(), threading.Event()
    got = {}

    def learner():
        with rf.set_recurrent_mode(True):
            learner_in.set()
            actor_in.wait()  # the actor entered its context after this one
            try:
                got["batch"] = compiled(batch_td.clone())["logits"]
            finally:
                learner_done.set()

    def actor():
        learner_in.wait()
        with rf.set_recurrent_mode(False):
            actor_in.set()
            learner_done.wait()  # still inside its context while the learner calls
            got["step"] = compiled(step_td.clone())["logits"]

    threads = [threading.Thread(target=learner), threading.Thread(target=actor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.testing.assert_close(got["batch"], want_batch, **FP32_TOL)
    torch.testing.assert_close(got["step"], want_step, **FP32_TOL)


@pytest.mark.usefixtures("reset_mode_mirrors")
@pytest.mark.parametrize("kind", ["ours", "torchrl"])
def test_compiled_step_in_a_thread_without_context_ignores_another_threads_context(kind):
    """TorchRL loaded (as in every TorchRL pipeline): a compiled policy step in a thread that entered no context (a
    collector's background thread, ``collector.start()``) runs in sequential mode while the learner thread holds
    ``set_recurrent_mode(True)``, ours or TorchRL's. TorchRL's compile-time flag is one per process: read there, the
    step ran as a recurrent sequence over the batch (TorchRL's own modules still do)."""
    policy = make_policy("lstm")
    step_td = policy_input("lstm", "step")
    want_step = call_policy(policy, step_td, "step")["logits"]
    compiled = torch.compile(policy, fullgraph=True, backend=FAST)
    inside, done = threading.Event(), threading.Event()

    def learner():
        with _mode_context(kind)(True):
            inside.set()
            done.wait()

    thread = threading.Thread(target=learner)
    thread.start()
    inside.wait()
    try:
        with torch.no_grad():
            got = compiled(step_td.clone())["logits"]  # this thread: no context
    finally:
        done.set()
        thread.join()
    torch.testing.assert_close(got, want_step, **FP32_TOL)


def test_compiled_call_in_a_thread_without_context_runs_sequential_without_torchrl(tmp_path):
    """Without TorchRL loaded, a compiled step in a thread with no context runs in sequential mode while
    another thread holds ``set_recurrent_mode(True)`` (in a fresh process: this suite loads TorchRL, whose own
    compile-time flag is one per process; see ``docs/compile.md``)."""
    import subprocess
    import sys

    script = tmp_path / "threads.py"
    script.write_text(
        "import sys, threading, torch\n"
        "from tensordict import TensorDict\n"
        "import rnn_functional as rf\n"
        "torch.manual_seed(0)\n"
        "m = rf.GRUModule(input_size=3, hidden_size=4, in_key='obs', out_key='feat')\n"
        "c = torch.compile(m, fullgraph=True, backend='aot_eager')\n"
        "td = TensorDict({'obs': torch.randn(4, 3), 'is_init': torch.zeros(4, 1, dtype=torch.bool),\n"
        "                 'recurrent_state': torch.randn(4, 1, 4)}, [4])\n"
        "want = m(td.clone())['feat']\n"
        "inside, done = threading.Event(), threading.Event()\n"
        "def learner():\n"
        "    with rf.set_recurrent_mode(True):\n"
        "        inside.set(); done.wait()\n"
        "t = threading.Thread(target=learner); t.start(); inside.wait()\n"
        "try:\n"
        "    got = c(td.clone())['feat']\n"
        "finally:\n"
        "    done.set(); t.join()\n"
        "assert 'torchrl' not in sys.modules\n"
        "torch.testing.assert_close(got, want)\n"
        "print('sequential')\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "sequential" in run.stdout, run.stderr[-2000:]
