"""Training our module under DistributedDataParallel (2 CPU processes, gloo)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp
from module_helpers import ddp_loss, ddp_policy_and_data, ddp_worker


def test_ddp_gloo_gradients_equal_single_process(tmp_path):
    out = tmp_path / "grads.pt"
    workers = mp.spawn(ddp_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=False)
    deadline = time.monotonic() + 300
    while not workers.join(timeout=5):
        if time.monotonic() > deadline:
            for process in workers.processes:
                process.kill()
            pytest.fail("DDP workers did not finish within 300 s")
    ddp_grads = torch.load(out)

    policy, data = ddp_policy_and_data()
    ddp_loss(policy, data).backward()
    single = {n: p.grad for n, p in policy.named_parameters()}
    assert set(ddp_grads) == set(single)
    lstm_names = [n for n in single if ".lstm." in n]
    assert lstm_names and all(single[n].abs().sum() > 0 for n in lstm_names)
    for name, grad in single.items():
        torch.testing.assert_close(ddp_grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")
