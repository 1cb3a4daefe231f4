"""Four threads each train their own small MLP, as a user serving several models from one
process would (`python threads_train.py DEVICE`): an AdamW step, a backward, a `.item()`
sync while the other threads record, and a tensor handed from one thread to the next.
Prints one JSON line: every thread's losses and final weights."""
import json
import sys
import threading

import torch
import torch.nn as nn

dev = sys.argv[1]
if dev == "tpu":
    import torch_tpu  # noqa: F401  (registers the device)

STEPS = 8
handoff = {}  # thread k puts its last hidden batch here; thread k+1 adds it to its input
ready = [threading.Event() for _ in range(4)]
results = {}


def make_model(k):  # on the main thread: the global generator is the process's
    torch.manual_seed(k)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


models = [make_model(k) for k in range(4)]


def work(k):
    try:
        model = models[k].to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(100 + k)
        losses = []
        for step in range(STEPS):
            x = torch.randn(8, 16, generator=g).to(dev)
            y = torch.randn(8, 4, generator=g).to(dev)
            if step == STEPS // 2 and k > 0:  # a tensor recorded by another thread
                ready[k - 1].wait(120)
                x = x + handoff[k - 1]
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if step == STEPS // 2:
                handoff[k] = (x * 0.5).detach()
                ready[k].set()
        results[k] = {"losses": losses,
                      "weights": [p.detach().cpu().flatten().tolist()[:16] for p in model.parameters()]}
    except Exception as e:  # noqa: BLE001  (the thread's result says what went wrong)
        results[k] = f"{type(e).__name__}: {e}"
        for ev in ready:
            ev.set()


threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join(300)
print(json.dumps([results.get(k, "did not finish") for k in range(4)]))
