"""Every torch optimizer that PyTorch's own CUDA-graph tests capture (test/test_cuda.py:
test_graph_optims, test_graph_optims_with_explicitly_capturable_param_groups,
test_graph_scaling_fused_optimizers), in the documentation's recipe: warm up on a side
stream, capture a whole training step (forward, backward, step) with `torch.cuda.graph`,
then replay it over new batches copied into its static inputs. Optimizers with a step
count are built with capturable=True (torch refuses them under capture otherwise); SGD
and Adagrad have no such option and capture as they are. Two cases keep a tensor lr that
a scheduler changes between replays, two run GradScaler with a fused optimizer.

FORCE_CPU=1 runs the same steps eagerly on the CPU (no graphs, no capturable there).
CASES=a,b picks cases (default: all). Prints "RESULT {json}": per case ("cases"), the losses,
the parameters after the last step, and how many programs the replays built.
"""
import contextlib
import json
import os

import torch
from torch import nn, optim

device = "cpu" if os.environ.get("FORCE_CPU") == "1" else "cuda"
STEPS = 4
C = {"capturable": True}

CASES = {  # name: (optimizer, its arguments, scheduler or None, GradScaler?)
    "sgd": (optim.SGD, dict(lr=0.1), None, False),
    "sgd_momentum": (optim.SGD, dict(lr=0.1, momentum=0.9), None, False),
    "sgd_nesterov_foreach": (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True,
                                             weight_decay=0.1, foreach=True), None, False),
    "sgd_fused": (optim.SGD, dict(lr=0.1, momentum=0.9, fused=True), None, False),
    "adagrad": (optim.Adagrad, dict(lr=0.1), None, False),
    "adagrad_fused": (optim.Adagrad, dict(lr=0.1, fused=True), None, False),
    "adam": (optim.Adam, dict(lr=0.1, betas=(0.8, 0.7), **C), None, False),
    "adam_foreach_amsgrad": (optim.Adam, dict(lr=0.1, betas=(0.8, 0.7), foreach=True,
                                              amsgrad=True, **C), None, False),
    "adamw": (optim.AdamW, dict(lr=0.1, betas=(0.8, 0.7), **C), None, False),
    "adamw_fused_amsgrad": (optim.AdamW, dict(lr=0.1, fused=True, amsgrad=True, **C), None,
                            False),
    "nadam_decoupled": (optim.NAdam, dict(lr=0.1, betas=(0.8, 0.7), weight_decay=0.1,
                                          decoupled_weight_decay=True, **C), None, False),
    "radam_foreach": (optim.RAdam, dict(lr=0.1, betas=(0.8, 0.7), weight_decay=0.1,
                                        foreach=True, **C), None, False),
    "rprop_maximize": (optim.Rprop, dict(lr=0.1, maximize=True, **C), None, False),
    "adamax": (optim.Adamax, dict(lr=0.1, weight_decay=0.1, **C), None, False),
    "asgd": (optim.ASGD, dict(lr=0.1, **C), None, False),
    "adadelta": (optim.Adadelta, dict(lr=0.1, weight_decay=0.1, **C), None, False),
    "rmsprop": (optim.RMSprop, dict(lr=0.01, momentum=0.5, **C), None, False),
    "adam_scheduled": (optim.Adam, dict(lr="tensor", **C),
                       lambda o: optim.lr_scheduler.ExponentialLR(o, gamma=0.8), False),
    # (foreach SGD reads a tensor lr on the host, which no capture allows: fused takes it)
    "sgd_scheduled": (optim.SGD, dict(lr="tensor", momentum=0.9, fused=True),
                      lambda o: optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5), False),
    "adamw_fused_scaler": (optim.AdamW, dict(lr=0.1, fused=True, **C), None, True),
    "sgd_fused_scaler": (optim.SGD, dict(lr=0.1, momentum=0.9, fused=True), None, True),
}


def programs_built():
    if device == "cpu" or not hasattr(torch, "tpu"):
        return 0
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


def run(name):
    ctor, kwargs, schedule, scaled = CASES[name]
    kwargs = dict(kwargs)
    if device == "cpu":
        kwargs.pop("capturable", None)
    if kwargs.get("lr") == "tensor":
        kwargs["lr"] = torch.tensor(0.05, device=device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 3)).to(device)
    opt = ctor(model.parameters(), **kwargs)
    scheduler = schedule(opt) if schedule else None
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8) if scaled else None
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 12, generator=g), torch.randn(8, 3, generator=g))
               for _ in range(STEPS + 3)]
    static_x = torch.zeros(8, 12, device=device)
    static_y = torch.zeros(8, 3, device=device)

    def step():
        loss = nn.functional.mse_loss(model(static_x), static_y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss

    losses = []
    # warm up on a side stream: the optimizer's state exists before the capture
    s = torch.cuda.Stream() if device == "cuda" else None
    if s is not None:
        s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s) if s is not None else contextlib.nullcontext():
        for x, y in batches[:3]:
            static_x.copy_(x)
            static_y.copy_(y)
            opt.zero_grad(set_to_none=True)
            losses.append(step().item())
            if scheduler is not None:  # a training loop steps it every step
                scheduler.step()
    if s is not None:
        torch.cuda.current_stream().wait_stream(s)

    opt.zero_grad(set_to_none=True)
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step()
    before = programs_built()
    for x, y in batches[3:]:
        static_x.copy_(x)
        static_y.copy_(y)
        if device == "cuda":
            graph.replay()
        else:
            opt.zero_grad(set_to_none=True)
            static_loss = step()
        losses.append(static_loss.item())
        if scheduler is not None:
            scheduler.step()
    return {"losses": losses, "built": programs_built() - before,
            "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()]}


names = os.environ.get("CASES", "").split(",") if os.environ.get("CASES") else list(CASES)
print("RESULT " + json.dumps({"rank": 0, "cases": {name: run(name) for name in names}}))
