"""PyTorch's model-parallel tutorial pattern, written for CUDA: a model whose two halves
sit on cuda:0 and cuda:1, activations moved between them with .to(), trained with SGD;
then a hand pipeline over four devices (each stage its own device, micro-batches moved
stage to stage), and a tensor copied around the devices. FORCE_CPU=1 runs the same on the
CPU; COMPILE=1 wraps each half in torch.compile. Prints one `RESULT {json}` line."""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

cpu = os.environ.get("FORCE_CPU") == "1"
compile_halves = os.environ.get("COMPILE") == "1" and not cpu


def dev(i):
    return torch.device("cpu") if cpu else torch.device("cuda", i)


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32)).to(dev(0))
        self.net2 = nn.Sequential(nn.ReLU(), nn.Linear(32, 5)).to(dev(1))
        self.f1, self.f2 = self.net1, self.net2
        if compile_halves:
            self.f1, self.f2 = torch.compile(self.net1), torch.compile(self.net2)

    def forward(self, x):
        return self.f2(self.f1(x.to(dev(0))).to(dev(1)))


torch.manual_seed(0)
model = ToyModel()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    x, y = torch.randn(20, 10, generator=g), torch.randint(0, 5, (20,), generator=g)
    opt.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out, y.to(out.device))
    loss.backward()
    opt.step()
    losses.append(loss.item())
out_device = str(out.device)

# a pipeline over four devices, micro-batch by micro-batch
torch.manual_seed(2)
stages = [nn.Linear(8, 8).to(dev(i)) for i in range(4)]
batch = torch.randn(6, 8, generator=g)
piped = []
for micro in batch.split(2):
    h = micro
    for i, stage in enumerate(stages):
        h = torch.tanh(stage(h.to(dev(i))))
    piped.append(h.to(dev(0)))
pipe = torch.cat(piped)

# a value copied around the devices and back, in place and by .to()
t = torch.arange(12.0).reshape(3, 4).to(dev(0))
for i in (1, 2, 3, 0):
    u = torch.empty(3, 4, device=dev(i))
    u.copy_(t)
    t = (u * 2).to(dev((i + 1) % 4))

params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
devices = sorted({str(p.device) for p in model.parameters()})
print("RESULT " + json.dumps({
    "losses": losses, "params": params, "pipe": pipe.cpu().tolist(), "round": t.cpu().tolist(),
    "devices": devices, "out_device": out_device,
    "stage_devices": [str(s.weight.device) for s in stages],
    "count": 0 if cpu else torch.cuda.device_count()}))
