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


@pytest.fixture(scope="module")
def dtensor_results(tmp_path_factory):
    """torch_workers.dtensor_worker's results (name -> (placements, full tensor)), run once."""
    out = tmp_path_factory.mktemp("dtensor") / "dtensor.pt"
    spawn(torch_workers.dtensor_worker, 2, free_port(), str(out))
    return torch.load(out)


def dtensor_inputs():
    """The worker's x, w and 3-D cube (one generator, drawn in the worker's order)."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(8, 6, dtype=torch.float64, generator=generator)
    w = torch.randn(6, 4, dtype=torch.float64, generator=generator)
    cube = torch.randn(4, 6, 2, dtype=torch.float64, generator=generator)
    return x, w, cube, generator


def test_dtensor_sharded_over_two_processes_flows_through_opforge_ops(dtensor_results):
    results = dtensor_results
    x, w, _, _ = dtensor_inputs()
    softplus = torch_workers.softplus_op()
    h = x @ w
    expected = {"softplus": softplus(x), "matmul": h, "softmax": torch.softmax(h, dim=1), "reduce_sum": h.sum(0)}
    for name, value in expected.items():
        placements, full = results[name]
        torch.testing.assert_close(full, value, rtol=1e-12, atol=1e-12)
    # where a signature fits, the op ran shard by shard and its output keeps the sharding
    assert results["softplus"][0] == ("S(0)",)  # elementwise: x:S(0) -> y:S(0)
    assert results["matmul"][0] == ("S(0)",)  # a:S(0), b:B -> y:S(0)
    assert results["softmax"][0] == ("S(0)",)  # rows split, softmax along axis 1
    assert results["reduce_sum"][0] == ("P(sum)",)  # x:S(0) -> y:P: summed when read


def test_dtensor_calls_differing_in_an_attribute_each_get_their_own_sharding(dtensor_results):
    # DTensor caches its sharding decision per call signature: the attributes are part of it
    x, _, cube, _ = dtensor_inputs()
    expected = {"reduce_sum axes=[0]": ("P(sum)", x.sum(0)),  # the split axis reduced: addends
                "reduce_sum axes=[1]": ("S(0)", x.sum(1)),  # rows stay split
                "transpose perm=[1, 0, 2]": ("S(1)", cube.permute(1, 0, 2)),  # the split axis moves
                "transpose perm=[2, 1, 0]": ("S(2)", cube.permute(2, 1, 0))}
    for name, (placement, value) in expected.items():
        placements, full = dtensor_results[name]
        assert placements != "error", f"{name}: {full}"
        assert placements == (placement,), name
        torch.testing.assert_close(full, value, rtol=1e-12, atol=1e-12)


def test_dtensor_gradient_through_reduce_sum_equals_one_process(dtensor_results):
    x, _, _, generator = dtensor_inputs()
    for axes, n in (([0], 6), ([1], 8)):
        weights = torch.randn(n, dtype=torch.float64, generator=generator)
        xr = x.clone().requires_grad_()
        (torch.ops.opforge.reduce_sum(xr, axes=axes) * weights).sum().backward()
        placements, grad = dtensor_results[f"reduce_sum axes={axes} gradient"]
        assert placements != "error", f"reduce_sum axes={axes}: {grad}"
        torch.testing.assert_close(grad, xr.grad, rtol=1e-12, atol=1e-12)


def test_dtensor_gradient_through_layer_norm_with_unused_outputs_equals_one_process(dtensor_results):
    x, _, _, generator = dtensor_inputs()
    for n in (6, 8):  # the reduce_sum weights drawn before
        torch.randn(n, dtype=torch.float64, generator=generator)
    scale, bias = (torch.randn(6, dtype=torch.float64, generator=generator) for _ in range(2))
    inputs = [t.clone().requires_grad_() for t in (x, scale, bias)]
    y = torch.nn.functional.layer_norm(inputs[0], (6,), inputs[1], inputs[2], 1e-5)
    (y * y).sum().backward()
    for name, expected in zip(("x", "scale", "bias"), inputs):
        placements, grad = dtensor_results[f"layer_norm gradient {name}"]
        assert placements != "error", f"layer_norm gradient {name}: {grad}"
        torch.testing.assert_close(grad, expected.grad, rtol=1e-10, atol=1e-12)
