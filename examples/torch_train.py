"""Train a PyTorch model whose activation is an opforge C++ op, under torch.compile.

`softplus` is declared once -- schema, inference, a C++ kernel and a CUDA one
(softplus.cc, softplus.cu), a gradient rule -- and `opforge.torch.register`
makes it `torch.ops.torchmlp.softplus`: a torch op with a fake kernel (so torch.compile
traces it with no graph break) and autograd from the rule.  The model trains on
the GPU where torch has one (the CUDA kernel is compiled by nvcc at its first
use), else on the CPU.
"""
from pathlib import Path

import torch

import opforge
import opforge.torch
from opforge import ops

HERE = Path(__file__).resolve().parent  # softplus.cc and softplus.cu, the kernels

softplus = opforge.op("torchmlp::softplus(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"], replace=True,
                      doc="log(1 + exp(x)), computed without overflow.")
softplus.def_infer(opforge.infer.same_as(0))
softplus.kernel(source=f"{HERE / 'softplus.cc'}:Softplus", dtypes={"x": ["float32", "float64"]})
softplus.kernel(source=f"{HERE / 'softplus.cu'}:SoftplusGpu", device="gpu", dtypes={"x": ["float32", "float64"]})


@softplus.grad(save=["x"])
def _(saved, dy):
    return ops.mul(dy, ops.sigmoid(saved.x))  # built-in ops: the gradient is differentiable too


opforge.torch.register(softplus)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(8, 32)
        self.out = torch.nn.Linear(32, 1)

    def forward(self, x):
        return self.out(torch.ops.torchmlp.softplus(self.hidden(x)))


def main(steps=60):
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(256, 8, device=device)
    target = torch.sin(x.sum(dim=1, keepdim=True))
    model = Model().to(device)
    step = torch.compile(model, fullgraph=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for k in range(steps):
        loss = torch.nn.functional.mse_loss(step(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if k % 10 == 0 or k == steps - 1:
            print(f"step {k:3d}  loss {loss.item():.4f}  ({device})")
    return losses


if __name__ == "__main__":
    main()
