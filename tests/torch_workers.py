"""Code that test_torch_distributed.py runs in spawned processes (spawned children import
it by name, so it lives in its own module): a model whose activation is an opforge C++ op,
trained with PyTorch's distributed engines on the gloo backend."""
import os
import runpy
from pathlib import Path

import torch
import torch.distributed as dist

import opforge
import opforge.torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "torch_train.py"


def softplus_op():
    """examples/torch_train.py's ``torchmlp::softplus`` (a C++ kernel, a gradient rule), as a torch op."""
    if opforge.lookup("torchmlp::softplus") is None:
        runpy.run_path(str(EXAMPLE))  # declares and registers it (main() runs only as a script)
    return torch.ops.torchmlp.softplus


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(6, 16).double()
        self.out = torch.nn.Linear(16, 1).double()

    def forward(self, x):
        return self.out(torch.ops.torchmlp.softplus(self.hidden(x)))


def data():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(32, 6, dtype=torch.float64, generator=generator)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def train(model, x, target, steps, reduce_loss=lambda loss: loss):
    """SGD steps on mean squared error; returns (losses, gradients of the last step)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(reduce_loss(loss.detach()).item())
    return losses, [p.grad.clone() for p in model.parameters()]


def _init(rank, world, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def ddp_worker(rank, world, port, steps, out_path):
    """Rank ``rank`` of a DDP run: each rank trains on its half of the batch."""
    _init(rank, world, port)
    try:
        softplus_op()
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Model())
        x, target = data()
        half = x.shape[0] // world

        def averaged(loss):  # the full batch's loss: the mean of the ranks' (equal-sized) halves
            dist.all_reduce(loss)
            return loss / world

        losses, grads = train(model, x[rank * half:(rank + 1) * half], target[rank * half:(rank + 1) * half],
                              steps, averaged)
        if rank == 0:
            torch.save({"losses": losses, "grads": grads,
                        "params": [p.detach().clone() for p in model.module.parameters()]}, out_path)
        dist.barrier()  # no rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def dtensor_worker(rank, world, port, out_path):
    """Rank ``rank`` of a DTensor run: opforge ops on tensors sharded over a 1-D mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    _init(rank, world, port)
    try:
        mesh = init_device_mesh("cpu", (world,))
        softplus_op()
        opforge.torch.register("add", "matmul", "reduce_sum", "softmax")
        generator = torch.Generator().manual_seed(5)
        x = torch.randn(8, 6, dtype=torch.float64, generator=generator)
        w = torch.randn(6, 4, dtype=torch.float64, generator=generator)
        rows = distribute_tensor(x, mesh, [Shard(0)])
        weights = distribute_tensor(w, mesh, [Replicate()])
        results = {}
        y = torch.ops.torchmlp.softplus(rows)
        results["softplus"] = (y.placements, y.full_tensor())
        h = torch.ops.opforge.matmul(rows, weights)
        results["matmul"] = (h.placements, h.full_tensor())
        s = torch.ops.opforge.softmax(h, axis=1)
        results["softmax"] = (s.placements, s.full_tensor())
        r = torch.ops.opforge.reduce_sum(h, axes=[0], keep_dims=False)
        results["reduce_sum"] = (r.placements, r.full_tensor())
        # one op, one input, attributes that differ: each call gets its own sharding decision
        for axes in ([0], [1]):
            attempt(results, f"reduce_sum axes={axes}", lambda: torch.ops.opforge.reduce_sum(rows, axes=axes))
        cube = distribute_tensor(torch.randn(4, 6, 2, dtype=torch.float64, generator=generator), mesh, [Shard(0)])
        for perm in ([1, 0, 2], [2, 1, 0]):
            attempt(results, f"transpose perm={perm}", lambda: torch.ops.opforge.transpose(cube, perm=perm))
        # the gradient through reduce_sum, weighted so that each element of x gets its own
        for axes, n in (([0], 6), ([1], 8)):
            weights = distribute_tensor(torch.randn(n, dtype=torch.float64, generator=generator), mesh,
                                        [Replicate()])
            attempt(results, f"reduce_sum axes={axes} gradient",
                    lambda: _reduce_sum_gradient(distribute_tensor(x, mesh, [Shard(0)]), axes, weights))
        # layer_norm's mean and inv_std_dev unused: their gradients are zeros made as DTensors
        scale, bias = (torch.randn(6, dtype=torch.float64, generator=generator) for _ in range(2))
        for k, name in enumerate(("x", "scale", "bias")):
            attempt(results, f"layer_norm gradient {name}", lambda: _layer_norm_gradients(
                distribute_tensor(x, mesh, [Shard(0)]), *(distribute_tensor(t, mesh, [Replicate()])
                                                         for t in (scale, bias)))[k])
        if rank == 0:
            torch.save({name: (tuple(str(p) for p in placements), value) if isinstance(placements, tuple)
                        else (placements, value) for name, (placements, value) in results.items()}, out_path)
        dist.barrier()  # no rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def _reduce_sum_gradient(x, axes, weights):
    """The gradient of (reduce_sum(x, axes) * weights).sum() with respect to x."""
    x = x.detach().requires_grad_()
    (torch.ops.opforge.reduce_sum(x, axes=axes) * weights).sum().backward()
    return x.grad


def _layer_norm_gradients(x, scale, bias):
    """The gradients of (y * y).sum(), y = layer_norm(x, scale, bias)[0], with respect to each input."""
    inputs = [t.detach().requires_grad_() for t in (x, scale, bias)]
    y = torch.ops.opforge.layer_norm(*inputs, axis=-1, epsilon=1e-5)[0]
    (y * y).sum().backward()
    return [t.grad for t in inputs]


def attempt(results, name, compute):
    """results[name]: (placements, full tensor) of the DTensor compute() gives, or
    ("error", its message) where it raised, so the other results still come back."""
    try:
        y = compute()
        results[name] = (y.placements, y.full_tensor())
    except Exception as error:
        results[name] = ("error", f"{type(error).__name__}: {error}")
