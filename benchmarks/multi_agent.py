"""Our compiled ``MultiAgentGRU`` against BenchMARL's GRU model (its Python time loop), side by side in one process.

BenchMARL's on-policy recipe with a recurrent model (``base_experiment.yaml``: 6000 frames per batch over 10 envs)
trains on whole 600-step sequences: a minibatch of 400 frames rounds up to one ``[1, 600]`` sequence, and the
value pass over a batch is ``[10, 600]``. Both models see the same ``[B, T, n_agents, F]`` inputs, root
``is_init`` resets and zero start states (BenchMARL's training mode), hidden 128 (its ``gru.yaml``), shared
weights (its default). BenchMARL's model runs as its ``MultiAgentGRU`` module (``compile=False``, its default;
``compile=True`` compiles its 600-step Python loop unrolled). Ours is ``torch.compile(module)`` in recurrent mode,
and the same module eager (``recurrent_backend="auto"``). Ratios are BenchMARL's time over ours.

benchmarl 1.5.2 pins torchrl<0.12 and imports ``torchrl.collectors.SyncDataCollector`` (``Collector`` since
torchrl 0.12); it is installed here with ``pip install --no-deps benchmarl`` and given that name before the import.

    flock /tmp/bench.lock python benchmarks/multi_agent.py [--json results/multi_agent_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # _timing, and this checkout's rnn_functional
from _timing import environment, interleaved  # noqa: E402
from tensordict import TensorDict  # noqa: E402

import rnn_functional as rf  # noqa: E402

F, H = 18, 128  # VMAS navigation's observation (with lidar), BenchMARL's gru.yaml hidden size


def benchmarl_gru(n: int):
    import torchrl.collectors

    if not hasattr(torchrl.collectors, "SyncDataCollector"):
        torchrl.collectors.SyncDataCollector = torchrl.collectors.Collector  # the name benchmarl 1.5.2 imports
    from benchmarl.models.gru import MultiAgentGRU

    return MultiAgentGRU(F, H, n, "cpu", centralised=False, share_params=True, n_layers=1, dropout=0.0, bias=True,
                         compile=False)


def contenders(n: int, B: int, T: int, backward: bool) -> dict:
    torch.manual_seed(0)
    x, is_init = torch.randn(B, T, n, F), torch.zeros(B, T, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[:, T // 3] = is_init[:, 2 * T // 3] = True  # episodes end inside the sequence
    theirs = benchmarl_gru(n)
    ours = rf.MultiAgentGRU(F, H, n, default_recurrent_mode=True)
    for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):  # the same weights
        getattr(ours, f"{w}_l0").data.copy_(theirs.params["grus", "0", w])
    compiled = torch.compile(ours)
    td = TensorDict({"agents": TensorDict({"observation": x}, [B, T, n]), "is_init": is_init}, [B, T])

    def run_theirs():
        y, _ = theirs(x, is_init, None)
        if backward:
            y.sum().backward()
        return y

    def runner(module):
        def run():
            y = module(td.clone())["agents", "embed"]
            if backward:
                y.sum().backward()
            return y
        return run

    run_ours = runner(compiled)

    if not backward:  # the same computation (fp32, 600 steps: a looser tolerance than one step's)
        with torch.no_grad():
            torch.testing.assert_close(run_ours(), run_theirs(), rtol=1e-4, atol=1e-5)
    grad = torch.enable_grad if backward else torch.no_grad

    def wrap(fn):
        def call():
            with grad():
                fn()
        return call

    return {"benchmarl": wrap(run_theirs), "ours_compiled": wrap(run_ours), "ours_eager": wrap(runner(ours))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, nargs="+", default=[3, 16])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    print(f"{'n_agents':>8} {'[B, T]':>10} {'pass':>8} {'BenchMARL ms':>13} {'compiled ms':>12} {'ratio':>7} "
          f"{'eager ms':>9} {'ratio':>7}")
    for n in a.agents:
        for (B, T), backward in (((1, 600), False), ((1, 600), True), ((10, 600), False)):
            r = interleaved(contenders(n, B, T, backward), torch.device("cpu"), warmup=2, repeats=a.repeats)
            theirs, ours, eager = (r[k]["median_s"] for k in ("benchmarl", "ours_compiled", "ours_eager"))
            rows.append(dict(n_agents=n, B=B, T=T, backward=backward, benchmarl_s=theirs, ours_compiled_s=ours,
                             ours_eager_s=eager, ours_first_call_s=r["ours_compiled"]["first_call_s"]))
            print(f"{n:>8} {str([B, T]):>10} {'fwd+bwd' if backward else 'fwd':>8} {theirs * 1e3:>13.1f} "
                  f"{ours * 1e3:>12.1f} {theirs / ours:>6.1f}x {eager * 1e3:>9.1f} {theirs / eager:>6.1f}x",
                  flush=True)
    if a.json:
        env = environment(torch.device("cpu"))
        Path(a.json).write_text(json.dumps({"environment": env, "threads": a.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
