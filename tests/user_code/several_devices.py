"""A CUDA user's single-process, several-device script: tensors on cuda:0..3, the current
device (set_device, `with torch.cuda.device(i)`), copies between devices, ops that mix
devices refused, per-device RNG, a layer trained on cuda:1. Run with "cuda" -> "tpu" and
several devices visible; CHECK_BUFFERS=1 also reports the runtime device behind each
tensor (a test's introspection). Prints one `RESULT {json}` line."""
import json
import os

import torch

out = {"count": torch.cuda.device_count()}
devs = [torch.device("cuda", i) for i in range(4)]
xs = [torch.arange(6.0, device=d).reshape(2, 3) * (i + 1) for i, d in enumerate(devs)]
out["devices"] = [str(x.device) for x in xs]
out["values"] = [x.cpu().tolist() for x in xs]

# the current device
torch.cuda.set_device(2)
made = torch.ones(2, device="cuda")
out["current"] = torch.cuda.current_device()
with torch.cuda.device(3):
    inner = torch.zeros(2, device="cuda")
    out["inner_current"] = torch.cuda.current_device()
out["after"] = torch.cuda.current_device()
torch.cuda.set_device(0)
out["made"], out["inner"] = str(made.device), str(inner.device)

# copies: .to(), copy_ into a strided view, non-contiguous source, dtype change
moved = xs[0].to("cuda:1")
dst = torch.zeros(3, 4, device="cuda:3")
dst[:, 1:3].copy_(xs[2].t())
cast = torch.empty(2, 3, dtype=torch.float64, device="cuda:2")
cast.copy_(xs[1])
out["moved"], out["moved_device"] = moved.cpu().tolist(), str(moved.device)
out["dst"], out["cast"] = dst.cpu().tolist(), cast.cpu().tolist()
out["cast_dtype"] = str(cast.dtype)

# the same index list on every device (torch uploads it to the tensor's device)
out["picked"] = [x[:, [2, 0]].cpu().tolist() for x in xs]
ids = [torch.tensor([2, 0], device=d) for d in devs]

# mixing devices: CUDA's error, and the process goes on
try:
    xs[0] + xs[1]
    out["mixed"] = "no error"
except RuntimeError as e:
    out["mixed"] = str(e)
try:
    torch.add(xs[0], xs[0], out=torch.empty(2, 3, device="cuda:1"))
    out["mixed_out"] = "no error"
except RuntimeError as e:
    out["mixed_out"] = str(e)
out["still"] = (xs[0] * 2).sum().item()

# per-device RNG: each device's generator, seeded alike, draws alike; states per device
torch.cuda.manual_seed_all(7)
a = torch.randn(4, device="cuda:1")
b = torch.randn(4, device="cuda:2")
state = torch.cuda.get_rng_state(1)
c = torch.randn(4, device="cuda:1")
torch.cuda.set_rng_state(state, 1)
c2 = torch.randn(4, device="cuda:1")
out["rng_same_seed"] = torch.equal(a.cpu(), b.cpu())
out["rng_restored"] = torch.equal(c.cpu(), c2.cpu())
out["rng_states"] = len(torch.cuda.get_rng_state_all())

# memory per device: a 4 MiB tensor on cuda:3 counts there only
before = [torch.cuda.memory_allocated(i) for i in range(4)]
big = torch.zeros(1 << 20, device="cuda:3")
torch.cuda.synchronize()
grown = [torch.cuda.memory_allocated(i) - before[i] for i in range(4)]
out["memory_grown"] = grown
out["peak_3"] = torch.cuda.max_memory_allocated(3) >= (1 << 22)
free3, total3 = torch.cuda.mem_get_info(3)
free0, total0 = torch.cuda.mem_get_info(0)
out["free_less_on_3"] = total3 - free3 >= (1 << 22) and free0 - free3 >= (1 << 22) - (1 << 16)
del big

# a layer trained on cuda:1
torch.manual_seed(0)
layer = torch.nn.Linear(3, 2).to("cuda:1")
opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
for _ in range(3):
    loss = layer(xs[0].to("cuda:1")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
out["loss"] = loss.item()
out["grad_device"] = str(layer.weight.grad.device)
torch.cuda.synchronize()

if os.environ.get("CHECK_BUFFERS"):
    import jax
    from torch_tpu import _storage

    local = [d.id for d in jax.local_devices()]

    def where(t):
        buf = _storage.record(t.untyped_storage(), t.dtype)[0]
        return [local.index(d.id) for d in buf.devices()]

    out["buffers"] = {name: where(t) for name, t in [
        ("x0", xs[0]), ("x1", xs[1]), ("x2", xs[2]), ("x3", xs[3]), ("made", made),
        ("inner", inner), ("moved", moved), ("dst", dst), ("cast", cast), ("a", a), ("b", b),
        ("weight", layer.weight), ("grad", layer.weight.grad),
        ("adam", opt.state[layer.weight]["exp_avg"]), ("ids0", ids[0]), ("ids3", ids[3])]}
    out["direct_fallbacks"] = __import__("torch_tpu").metrics.counters.get("direct.fallbacks", 0)
print("RESULT " + json.dumps(out))
