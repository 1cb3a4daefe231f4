"""The misuse catalogue of issue 16: what real user code gets wrong, and what tpu does then.

Each case is user code written for a device string, run with "tpu" in Strict, Debug and
DeferAndFuse, and judged against the same code on CPU, or against CUDA's documented
behaviour where CPU has no analogue (the `ref=` text says which behaviour). The
machinery, the comparison rules and the process layout are in tests/helpers/misuse.py.

    python tests/reliability/misuse_catalogue.py            # run everything, print the verdicts
    python tests/reliability/misuse_catalogue.py --write    # ... and regenerate docs/RELIABILITY.md
    python tests/reliability/misuse_catalogue.py --mode debug --case int_floordiv_by_zero   # one case

PENDING lists the cases that fail today: because of an item of issue 16 still being fixed,
or because of a bug the catalogue found (marked "new", reported). tests/reliability/test_misuse.py runs
them as strict xfails, so a fix turns the test red until its entry is removed (then rerun
--write). A key is `case` (every mode) or `case@mode` (that mode only).
"""
from __future__ import annotations

import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # its cases, and tests/helpers

import torch
import torch.nn.functional as F
from helpers import misuse
from helpers.misuse import DEBUG_NAN, Raises, Returns, Survives, case, matrix
from torch import nn

_DENORM = "issue 16 item 10"
PENDING = {
    "float64_denormal_product": _DENORM, "float64_denormal_roundtrip": _DENORM,
    "float32_denormal_product": _DENORM,
}


# ---------------------------------------------------------------- 1: CPU scalar tensors
@case(item=1)
def cpu_scalar_mul(dev):
    return torch.ones(3, device=dev) * torch.tensor(2.5)


@case(item=1)
def cpu_scalar_add(dev):
    return torch.ones(3, device=dev) + torch.tensor(2.5)


@case(item=1)
def cpu_scalar_on_the_left(dev):
    x = torch.arange(1.0, 4.0, device=dev)
    return torch.tensor(2.0) - x, torch.tensor(3.0) / x, torch.tensor(2.0) ** x


@case(item=1)
def cpu_scalar_promotion(dev):
    i, h = torch.arange(3, device=dev), torch.ones(2, dtype=torch.bfloat16, device=dev)
    # a float 0-dim tensor lifts int to the default float; a float64 one does not widen bf16
    return i * torch.tensor(2.5), h * torch.tensor(2.5, dtype=torch.float64), i + torch.tensor(7)


@case(item=1)
def cpu_scalar_inplace(dev):
    x = torch.ones(3, device=dev)
    x.mul_(torch.tensor(3.0)).add_(torch.tensor(1))
    return x


@case(item=1)
def cpu_scalar_where_clamp_compare(dev):
    x = torch.arange(4.0, device=dev)
    return (torch.where(x > 1, x, torch.tensor(-1.0)), x.clamp(max=torch.tensor(1.5)),
            x[x > torch.tensor(1.0)])


@case(item=1)
def cpu_scalar_mutated_after_use(dev):
    s = torch.tensor(2.0)
    y = torch.ones(3, device=dev) * s
    s.fill_(5.0)  # the product was taken with 2.0: a later write must not reach it
    return y


@case(item=1)
def cpu_scalar_scales_loss(dev):
    w = torch.arange(3.0, device=dev).requires_grad_()
    ((w * w).sum() * torch.tensor(0.5)).backward()  # GradScaler-style scaling
    return w.grad


# ---------------------------------------------------------------- 2: out-of-range indices
OOB = {"item": 2, "ref": "CUDA: a device-side assert, a RuntimeError at the next sync",
       "expect": Raises(RuntimeError)}


@case(**OOB)
def index_out_of_range(dev):
    return torch.arange(5.0, device=dev)[torch.tensor([7, 1])]


@case(**OOB)
def index_negative_out_of_range(dev):
    return torch.arange(5.0, device=dev)[torch.tensor([-6], device=dev)]


@case(**OOB)
def index_put_out_of_range(dev):
    z = torch.zeros(3, device=dev)
    z[torch.tensor([4], device=dev)] = 1.0
    return z


@case(**OOB)
def index_select_out_of_range(dev):
    return matrix(dev).index_select(1, torch.tensor([3], device=dev))


@case(**OOB)
def gather_out_of_range(dev):
    return torch.gather(matrix(dev), 1, torch.tensor([[0, 3]], device=dev))


@case(**OOB)
def scatter_out_of_range(dev):
    return torch.zeros(3, device=dev).scatter_(0, torch.tensor([4], device=dev),
                                               torch.ones(1, device=dev))


@case(**OOB)
def embedding_out_of_range(dev):
    emb = nn.Embedding(5, 3).to(dev)
    return emb(torch.tensor([[1, 12]], device=dev))


@case(**OOB)
def take_out_of_range(dev):
    return torch.take(matrix(dev), torch.tensor([9], device=dev))


@case(**OOB)
def nll_loss_target_out_of_range(dev):
    return F.nll_loss(torch.randn(2, 3, device=dev).log_softmax(1), torch.tensor([0, 5], device=dev))


@case(**OOB)
def cross_entropy_target_out_of_range(dev):
    return F.cross_entropy(torch.randn(2, 3, device=dev), torch.tensor([3, 0], device=dev))


@case(item=2, ref="CUDA: asynchronous, so the error comes at the next sync",
      expect=Returns("raised at the sync"),
      modes={"debug": (Returns("raised at the call"),
                       "CUDA with CUDA_LAUNCH_BLOCKING=1: at the call")})
def index_error_comes_at_the_sync(dev):
    x, i = torch.arange(5.0, device=dev), torch.tensor([1, 9], device=dev)
    try:
        y = x[i] * 2
    except RuntimeError:
        return "raised at the call"
    try:
        y.sum().item()
    except RuntimeError:
        return "raised at the sync"
    return "no error"


@case(item=2)
def valid_indices_are_not_refused(dev):
    x = matrix(dev)
    return (x.flatten()[torch.tensor([-1, -6, 0])], x[:, torch.tensor([-1], device=dev)],
            torch.gather(x, 1, torch.tensor([[2, 0]], device=dev)),
            F.embedding(torch.tensor([4, 0], device=dev), torch.arange(10.0, device=dev).view(5, 2)),
            F.cross_entropy(x, torch.tensor([2, 0], device=dev)))


@case(item=2, close=True)
def index_error_then_next_step(dev):
    emb = nn.Embedding(5, 2).to(dev)
    try:
        emb(torch.tensor([7], device=dev)).sum().item()
    except (IndexError, RuntimeError):
        pass
    return emb(torch.tensor([4, 0], device=dev)).sum(1)


# ---------------------------------------------------------------- 3: memory
OOM = "CUDA: torch.OutOfMemoryError at the call; the process goes on"


@case(item=3, ref=OOM, expect=Raises(torch.OutOfMemoryError))
def huge_empty(dev):
    return torch.empty(1 << 40, device=dev).shape  # 4 TiB


@case(item=3, ref=OOM + ", memory_allocated() unchanged",
      expect=Returns(("OutOfMemoryError", True)))
def huge_alloc_leaves_accounting(dev):
    before = torch.tpu.memory_allocated()
    try:
        torch.zeros(1 << 38, 4, device=dev)
        raised = "nothing"
    except Exception as e:  # noqa: BLE001  (the class is the answer)
        raised = type(e).__name__
    return raised, torch.tpu.memory_allocated() == before


@case(item=3, ref="CUDA: mem_get_info() is (free, total) and total is the device's memory",
      expect=Returns((True, True)))
def mem_get_info_reports_capacity(dev):
    free, total = torch.tpu.mem_get_info()
    return 0 < free <= total, torch.tpu.get_device_properties().total_memory == total


@case(item=3, ref="CUDA: memory_allocated() falls by the tensor's bytes at del",
      expect=Returns(4 << 20))
def memory_allocated_falls_at_del(dev):
    x = torch.ones(1 << 20, device=dev)
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    del x
    return before - torch.tpu.memory_allocated()


@case(item=3, ref=OOM + "; freeing what it holds lets it allocate again",
      expect=Returns(("OutOfMemoryError", True, 8.0)),
      env={"TORCH_TPU_MEMORY_LIMIT": str(64 << 20)})
def allocate_until_oom_then_free(dev):
    held, raised = [], "nothing"
    for _ in range(12):  # 12 x 16 MiB: past a 64 MiB budget, bounded if there is none
        try:
            held.append(torch.ones(4 << 20, device=dev))
            held[-1].sum().item()
        except Exception as e:  # noqa: BLE001  (the class is the answer)
            raised = type(e).__name__
            break
    got_some = len(held) >= 2
    held.clear()
    return raised, got_some, torch.ones(8, device=dev).sum().item()


@case(item=3)
def negative_size(dev):
    return torch.empty(2, -1, device=dev)


# ---------------------------------------------------------------- 4: fork
FORK_CHILD_S = 10  # "at once"; CUDA raises in well under a second


def _fork_child(q):
    try:
        q.put(("ok", torch.ones(2, device="tpu").sum().item()))
    except Exception as e:  # noqa: BLE001  (the class is the answer)
        q.put((type(e).__name__, "spawn" in str(e)))


@case(item=4, ref="CUDA: a forked child that touches the device raises a RuntimeError at "
      "once, naming the 'spawn' start method", expect=Returns(("RuntimeError", True)), env={})
def fork_child_touches_tpu(dev):
    import multiprocessing as mp
    torch.ones(2, device=dev).sum().item()  # the parent has used the device
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_fork_child, args=(q,))
    p.start()
    try:
        return q.get(timeout=FORK_CHILD_S)
    finally:
        p.join(2)
        if p.is_alive():
            p.kill()
            p.join()


class _TpuMaking(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i), device="tpu")


@case(item=4, env={})
def dataloader_cpu_workers_after_tpu_use(dev):
    torch.ones(2, device=dev).sum().item()
    data = torch.utils.data.TensorDataset(torch.arange(16.0).view(8, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=2, num_workers=2, timeout=FORK_CHILD_S)
    return sum(b.to(dev).sum() for (b,) in loader)


@case(item=4, ref="CUDA: the worker's RuntimeError (use 'spawn') re-raised in the main process",
      expect=Raises(RuntimeError, "spawn"), env={})
def dataloader_worker_makes_tpu_tensors(dev):
    torch.ones(2, device=dev).sum().item()
    loader = torch.utils.data.DataLoader(_TpuMaking(), batch_size=2, num_workers=2,
                                         timeout=FORK_CHILD_S)
    return [b.sum().item() for b in loader]


# ---------------------------------------------------------------- 5: threads
@case(item=5, close=True)
def threads_run_ops(dev):
    out = {}

    def work(k):
        try:
            w = torch.randn(8, 8, generator=torch.Generator().manual_seed(k)).to(dev)
            x, seen = torch.ones(4, 8, device=dev), []
            for i in range(12):
                x = torch.tanh(x @ w) + k
                if i % 3 == 2:
                    seen.append(x.sum().item())  # a sync here while the others record
            out[k] = x.sum(0), seen
        except Exception as e:  # noqa: BLE001  (the thread's result says what went wrong)
            out[k] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return [out.get(k, "did not finish") for k in range(4)]


# ---------------------------------------------------------------- 6: refusals
OVERLAP = "more than one element of the written-to tensor refers to a single memory location"


@case(item=6, fragment=OVERLAP)
def internal_overlap_inplace(dev):
    return torch.zeros(1, 3, device=dev).expand(4, 3).add_(1)


@case(item=6, fragment=OVERLAP)
def internal_overlap_out(dev):
    return torch.add(torch.ones(4, 3, device=dev), 1, out=torch.zeros(1, 3, device=dev).expand(4, 3))


PARTIAL = "some elements of the input tensor and the written-to tensor refer to a single memory location"


@case(item=6, fragment=PARTIAL)
def partial_overlap_inplace(dev):
    x = torch.arange(6.0, device=dev)
    return x[1:].add_(x[:-1])  # CPU refuses rather than read what it already wrote


@case(item=6, fragment=PARTIAL)
def partial_overlap_out(dev):
    x = torch.arange(6.0, device=dev)
    return torch.add(x[:-1], 1, out=x[1:])


@case(item=6, fragment=PARTIAL)
def partial_overlap_copy(dev):
    x = torch.arange(6.0, device=dev)
    return x[1:].copy_(x[:-1])


@case(item=6)
def overlap_that_cpu_accepts(dev):
    x = torch.arange(6.0, device=dev)
    x.mul_(x)  # the same elements: each is read before it is written
    x[:3].add_(x[3:])  # one storage, no element shared
    return x


@case(item=6, fragment="result type Float can't be cast to the desired output type Long")
def out_dtype_cannot_cast(dev):
    return torch.add(torch.ones(2, device=dev), 1.5, out=torch.empty(2, dtype=torch.long, device=dev))


@case(item=6, fragment="result type Float can't be cast to the desired output type Long")
def inplace_int_plus_float(dev):
    return torch.arange(3, device=dev).add_(1.5)


@case(item=6)
def out_dtype_widening_and_resize(dev):
    a = torch.arange(3, device=dev)
    wide = torch.add(a, a, out=torch.empty(3, dtype=torch.float64, device=dev))
    return wide, torch.add(a, 1, out=torch.empty(2, dtype=torch.long, device=dev))  # resized


@case(item=6, fragment="expected m1 and m2 to have the same dtype")
def matmul_float_long(dev):
    return torch.ones(2, 2, device=dev) @ torch.ones(2, 2, dtype=torch.long, device=dev)


@case(item=6, fragment="must have the same dtype")
def linear_double_input(dev):
    return nn.Linear(3, 2).to(dev)(torch.ones(1, 3, dtype=torch.float64, device=dev))


@case(item=6)
def bmm_float_half(dev):
    return torch.bmm(torch.ones(1, 2, 2, device=dev), torch.ones(1, 2, 2, dtype=torch.half, device=dev))


# ---------------------------------------------------------------- 7: exception classes
DIM = "Dimension out of range"


@case(item=7, fragment=DIM)
def softmax_dim_out_of_range(dev):
    return matrix(dev).softmax(dim=5)


@case(item=7, fragment=DIM)
def sum_dim_out_of_range(dev):
    return matrix(dev).sum(dim=-3)


@case(item=7, fragment=DIM)
def transpose_dim_out_of_range(dev):
    return matrix(dev).transpose(0, 2)


@case(item=7, fragment=DIM)
def cat_dim_out_of_range(dev):
    return torch.cat([matrix(dev), matrix(dev)], dim=2)


@case(item=7, fragment="index 5 is out of bounds for dimension 0 with size 5")
def int_index_out_of_range(dev):
    return torch.arange(5, device=dev)[5]


@case(item=7)
def index_select_float_index(dev):
    return torch.ones(3, device=dev).index_select(0, torch.tensor([0.0], device=dev))


@case(item=7, fragment="tensors used as indices must be long, int, byte or bool tensors")
def float_tensor_as_index(dev):
    return torch.ones(3, device=dev)[torch.tensor([0.0], device=dev)]


@case(item=7, fragment="The shape of the mask")
def mask_of_wrong_shape(dev):
    return torch.ones(3, device=dev)[torch.tensor([True, False], device=dev)]


# ---------------------------------------------------------------- 8: generators
def _rng(dev):
    """torch.tpu on tpu, torch (the CPU generator) on cpu: the same calls."""
    return torch.tpu if dev == "tpu" else torch


@case(item=8, ref="CUDA: set_rng_state of 16 bytes 0xFF raises RuntimeError (offset must be a "
      "multiple of 4); random ops keep working", expect=Raises(RuntimeError))
def set_rng_state_garbage(dev):
    torch.tpu.set_rng_state(torch.full((16,), 255, dtype=torch.uint8))
    return torch.rand(2, device=dev)


@case(item=8, ref="CUDA: RuntimeError 'RNG state is wrong size'", expect=Raises(RuntimeError))
def set_rng_state_wrong_size(dev):
    torch.tpu.set_rng_state(torch.zeros(5, dtype=torch.uint8))


@case(item=8)
def set_rng_state_wrong_dtype(dev):
    _rng(dev).set_rng_state(torch.zeros(16))


@case(item=8)
def rng_state_roundtrip(dev):
    state = _rng(dev).get_rng_state()
    a = torch.rand(5, device=dev)
    _rng(dev).set_rng_state(state)
    return torch.equal(a, torch.rand(5, device=dev)), state.dtype, state.device.type


@case(item=8, ref="CUDA: RuntimeError \"Expected a 'cuda' device type for generator\"",
      expect=Raises(RuntimeError))
def generator_of_the_wrong_device(dev):
    return torch.randn(3, device=dev, generator=torch.Generator())


@case(item=8)
def generator_reseeded_reproduces(dev):
    g = torch.Generator(device=dev).manual_seed(3)
    a = torch.randn(4, generator=g, device=dev)
    g.manual_seed(3)
    return torch.equal(a, torch.randn(4, generator=g, device=dev)), g.device.type == dev


@case(item=8)
def dropout_reproduces_after_manual_seed(dev):
    torch.manual_seed(1)
    a = F.dropout(torch.ones(64, device=dev), 0.5)
    torch.manual_seed(1)
    return torch.equal(a, F.dropout(torch.ones(64, device=dev), 0.5))


# ---------------------------------------------------------------- 9: Debug gaps
NO_CHECK = ("CUDA: no check, an unspecified value (a check on every integer division would "
            "cost a sync or a flag per op; Debug is the mode that checks)")
INT0 = {"item": 9, "fragment": "ZeroDivisionError",
        "modes": {"strict": (Survives(), NO_CHECK), "defer_and_fuse": (Survives(), NO_CHECK)}}


@case(**INT0)
def int_floordiv_by_zero(dev):
    return torch.tensor([5, 3], device=dev) // torch.tensor([0, 1], device=dev)


@case(**INT0)
def int_remainder_by_zero(dev):
    return torch.tensor([5, 3], device=dev) % torch.tensor([0, 2], device=dev)


@case(**INT0)
def int_trunc_div_by_zero(dev):
    return torch.div(torch.tensor([5], device=dev), torch.tensor([0], device=dev), rounding_mode="trunc")


@case(**INT0)
def int_floordiv_by_python_zero(dev):
    return torch.tensor([5], device=dev) // 0


@case(item=9)
def invalid_op_raises_at_the_call(dev):
    x = torch.zeros(0, device=dev)
    try:
        m = x.max()
    except RuntimeError:
        return "raised at the call"
    m.item()
    return "raised nothing at the call"


@case(item=9, modes=DEBUG_NAN)
def float_div_by_zero(dev):
    return torch.tensor([1.0, -1.0, 0.0], device=dev) / 0


# ---------------------------------------------------------------- 10: denormals
@case(item=10)
def float64_denormal_product(dev):
    return torch.tensor([1e-300, -1e-300], dtype=torch.float64, device=dev) * 1e-10


@case(item=10)
def float64_denormal_roundtrip(dev):
    x = torch.tensor([1e-310, 5e-324, -2e-320], dtype=torch.float64, device=dev)
    return x, x.sum().item()


@case(item=10)
def float32_denormal_product(dev):
    return torch.tensor([1e-30], device=dev) * 1e-10


import misuse_catalogue_user  # noqa: F401  (registers the cases of what else a user hits)

if __name__ == "__main__":
    sys.exit(misuse.main(sys.argv[1:], os.path.abspath(__file__), PENDING))
