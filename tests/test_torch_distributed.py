"""opforge ops inside PyTorch's distributed engines, for real: two processes on the gloo
backend (localhost), DDP training and DTensor sharding, compared with one process."""
import socket

import pytest
import torch
import torch.multiprocessing as mp

import torch_workers


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker, *args):
    mp.start_processes(worker, args=args, nprocs=2, join=True, start_method="spawn")


def test_ddp_training_with_an_opforge_op_equals_one_process(tmp_path):
    steps = 4
    spawn(torch_workers.ddp_worker, 2, free_port(), steps, str(tmp_path / "ddp.pt"))
    distributed = torch.load(tmp_path / "ddp.pt")

    torch_workers.softplus_op()
    torch.manual_seed(0)
    model = torch_workers.Model()
    x, target = torch_workers.data()
    losses, grads = torch_workers.train(model, x, target, steps)

    assert len(distributed["losses"]) == steps and distributed["losses"][-1] < distributed["losses"][0]
    torch.testing.assert_close(torch.tensor(distributed["losses"]), torch.tensor(losses), rtol=1e-10, atol=0)
    for theirs, ours in zip(distributed["grads"], grads):
        torch.testing.assert_close(theirs, ours, rtol=1e-9, atol=1e-12)
    for theirs, ours in zip(distributed["params"], model.parameters()):
        torch.testing.assert_close(theirs, ours.detach(), rtol=1e-9, atol=1e-12)


def test_torch_train_example_prints_a_decreasing_loss():
    import re
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "torch_train.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", done.stdout)]
    assert len(losses) >= 5 and losses[-1] < 0.8 * losses[0], done.stdout
