"""A training script written for CUDA in the common style (nanoGPT's setup, timm's
prefetcher, the AMP recipe of the PyTorch docs): TF32 and cuDNN flags, autocast keyed on
the device type, GradScaler, pinned memory and non-blocking copies on a side stream,
fused AdamW on the GPU, CUDA-event timing, peak-memory statistics; DDP over NCCL when
launched by torchrun.

tests/device/test_cuda_swap.py runs it after a whole-file `s/cuda/tpu/g; s/nccl/tpu_dist/g`
(the only edit), and as written with FORCE_CPU=1 (gloo under torchrun) for the reference
losses. It prints one line, "RESULT {json}", per process.
"""
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EPOCHS = 2
BATCH = 32
LR = 3e-3


class Net(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class CudaPrefetcher:
    """timm's PrefetchLoader: copy the next batch on a side stream while this one runs."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, device
        self.stream = torch.cuda.Stream()

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        ready = None
        for x, y in self.loader:
            with torch.cuda.stream(self.stream):
                nxt = (x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
            if ready is not None:
                yield ready
            torch.cuda.current_stream().wait_stream(self.stream)
            ready = nxt
        if ready is not None:
            yield ready


def make_data(n=256, classes=10):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 1, 16, 16, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x += torch.randn(classes, 1, 16, 16, generator=g)[y]  # a learnable pattern per class
    return TensorDataset(x, y)


def main():
    use_cuda = torch.cuda.is_available() and not os.environ.get("FORCE_CPU")
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        ddp_rank = int(os.environ["RANK"])
        ddp_local_rank = int(os.environ["LOCAL_RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        if use_cuda:
            assert torch.cuda.device_count() >= world_size, "not enough GPUs"
            device = f"cuda:{ddp_local_rank}"
            torch.cuda.set_device(device)
            dist.init_process_group(backend="nccl")
        else:
            device = "cpu"
            dist.init_process_group(backend="gloo")
    else:
        ddp_rank, ddp_local_rank, world_size = 0, 0, 1
        device = "cuda" if use_cuda else "cpu"
    device_type = "cuda" if "cuda" in device else "cpu"

    torch.manual_seed(1337)
    if use_cuda:
        torch.cuda.manual_seed_all(1337)
        torch.backends.cuda.matmul.allow_tf32 = True  # allow tf32 on matmul
        torch.backends.cudnn.allow_tf32 = True  # allow tf32 on cudnn
        torch.backends.cudnn.benchmark = True
        print(f"cudnn {torch.backends.cudnn.version()}, bf16: {torch.cuda.is_bf16_supported()}")
        torch.cuda.reset_peak_memory_stats()
    amp_dtype = (torch.bfloat16 if device_type == "cpu" or torch.cuda.is_bf16_supported()
                 else torch.float16)

    data = make_data()
    sampler = DistributedSampler(data, shuffle=True, seed=7) if ddp else None
    loader = DataLoader(data, batch_size=BATCH // world_size, sampler=sampler,
                        shuffle=sampler is None, pin_memory=True,
                        generator=torch.Generator().manual_seed(7))
    batches = CudaPrefetcher(loader, device) if use_cuda else loader

    model = Net().to(device)
    raw_model = model
    if ddp:
        model = DDP(model, device_ids=[ddp_local_rank] if use_cuda else None)
    class_weight = torch.ones(10)
    class_weight[0] = 2.0
    if use_cuda:
        class_weight = class_weight.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01,
                                  fused=torch.device(device).type == "cuda")
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS * len(loader))
    scaler = torch.cuda.amp.GradScaler(enabled=use_cuda)

    losses, step_ms = [], []
    for epoch in range(EPOCHS):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        for x, y in batches:
            if not use_cuda:
                x, y = x.to(device), y.to(device)
            if use_cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                t0 = time.perf_counter()
            with torch.autocast(device_type=device_type, dtype=amp_dtype):
                loss = F.cross_entropy(model(x), y, weight=class_weight)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if use_cuda:
                end.record()
                torch.cuda.synchronize()
                step_ms.append(start.elapsed_time(end))
            else:
                step_ms.append((time.perf_counter() - t0) * 1000)
            losses.append(loss.item())

    # evaluation in the autocast dtype the device defaults to
    model.eval()
    x, y = data.tensors
    if device_type == "cuda":
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    with torch.no_grad(), torch.autocast(device_type=device_type):
        logits = raw_model(x)
        eval_dtype = str(logits.dtype)
        eval_loss = F.cross_entropy(logits.float(), y).item()
        accuracy = (logits.argmax(-1) == y).float().mean().item()

    max_mem_mb = torch.cuda.max_memory_allocated() / 2**20 if use_cuda else 0.0
    if use_cuda:
        torch.cuda.empty_cache()
    out = {"rank": ddp_rank, "device": str(next(raw_model.parameters()).device),
           "losses": losses, "eval_loss": eval_loss, "accuracy": accuracy,
           "eval_dtype": eval_dtype, "step_ms": step_ms, "max_mem_mb": max_mem_mb,
           "scale": scaler.get_scale() if scaler.is_enabled() else None,
           "params": [p.detach().float().sum().item() for p in raw_model.parameters()]}
    assert all(math.isfinite(v) for v in losses)
    print("RESULT " + json.dumps(out), flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
