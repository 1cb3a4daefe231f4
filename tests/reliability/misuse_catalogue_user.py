"""The misuse catalogue, continued: what else a user hits beyond the items of issue 16
(devices, dtypes and shapes, views, empty tensors, checkpoints, autograd, host conversions,
the mode API, interrupted and failed steps). tests/reliability/misuse_catalogue.py imports this file;
the rules are the same (tests/helpers/misuse.py).
"""
from __future__ import annotations

import copy
import io
import json
import os
import pickle
import signal
import subprocess
import sys

import torch
import torch.nn.functional as F
from helpers.misuse import DEBUG_NAN, Raises, Returns, case, matrix
from torch import nn

# ---------------------------------------------------------------- devices
SAME = "Expected all tensors to be on the same device"
MIXED = {"ref": "CUDA: RuntimeError 'Expected all tensors to be on the same device'",
         "expect": Raises(RuntimeError, SAME)}


@case(**MIXED)
def device_mismatch_add(dev):
    return torch.ones(2, device=dev) + torch.ones(2)


@case(**MIXED)
def device_mismatch_matmul(dev):
    return torch.ones(2, 2, device=dev) @ torch.ones(2, 2)


@case(**MIXED)
def module_left_on_cpu(dev):
    return nn.Linear(3, 2)(torch.ones(1, 3, device=dev))


@case(**MIXED)
def cat_across_devices(dev):
    return torch.cat([torch.ones(2, device=dev), torch.ones(2)])


@case(ref="CUDA: RuntimeError 'indices should be either on cpu or on the same device'",
      expect=Raises(RuntimeError))
def device_index_into_cpu_tensor(dev):
    return torch.arange(4.0)[torch.tensor([1], device=dev)]


@case(ref="CUDA: RuntimeError naming the device of the assigned grad", expect=Raises(RuntimeError))
def grad_assigned_on_another_device(dev):
    p = torch.ones(2, device=dev, requires_grad=True)
    p.grad = torch.zeros(2)


@case(ref="CUDA: RuntimeError 'invalid device ordinal'", expect=Raises(RuntimeError))
def device_ordinal_out_of_range(dev):
    return torch.ones(1, device=f"{dev}:7")


@case(ref="CUDA: a host-to-device copy reads its source at the call (non_blocking too, from "
      "pageable memory)", expect=Returns(([1.0] * 3, [1.0] * 3, [1.0] * 3)))
def upload_then_mutate_source(dev):
    import numpy as np
    c, a = torch.ones(3), np.ones(3, dtype=np.float32)
    t1, t2 = c.to(dev), c.to(dev, non_blocking=True)
    t3 = torch.from_numpy(a).to(dev)
    c.add_(1)
    a += 1
    return t1.tolist(), t2.tolist(), t3.tolist()


@case()
def copy_into_device_tensor_then_mutate(dev):
    c = torch.ones(2, 3)
    t = torch.zeros(2, 3, device=dev)
    t.copy_(c[0])  # broadcast from a CPU row
    c.mul_(5)
    return t


# ---------------------------------------------------------------- dtypes and shapes
@case(fragment="Negation, the `-` operator, on a bool tensor is not supported")
def bool_negation(dev):
    return -torch.tensor([True, False], device=dev)


@case(fragment="Subtraction, the `-` operator, with two bool tensors is not supported")
def bool_subtraction(dev):
    return torch.tensor([True], device=dev) - torch.tensor([False], device=dev)


@case()
def bitwise_and_on_float(dev):
    return torch.ones(2, device=dev) & 1


@case()
def randn_of_integer_dtype(dev):
    return torch.randn(3, dtype=torch.long, device=dev)


@case(fragment="random_ expects 'from' to be less than 'to'")
def randint_empty_range(dev):
    return torch.randint(5, 2, (3,), device=dev)


@case()
def nll_loss_float_target(dev):
    return F.nll_loss(torch.zeros(2, 3, device=dev), torch.tensor([0.0, 1.0], device=dev))


@case(fragment="The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1")
def broadcast_mismatch(dev):
    return torch.ones(2, 3, device=dev) + torch.ones(4, device=dev)


@case(fragment="mat1 and mat2 shapes cannot be multiplied (2x5 and 3x4)")
def linear_wrong_in_features(dev):
    return nn.Linear(3, 4).to(dev)(torch.ones(2, 5, device=dev))


@case(fragment="to have 3 channels")
def conv_wrong_channels(dev):
    return nn.Conv2d(3, 4, 3).to(dev)(torch.ones(1, 4, 8, 8, device=dev))


@case(fragment="Sizes of tensors must match except in dimension 0")
def cat_sizes_mismatch(dev):
    return torch.cat([torch.ones(2, 3, device=dev), torch.ones(2, 4, device=dev)])


@case()
def mixed_dtypes_promote(dev):
    f, h, i = torch.ones(2, device=dev), torch.ones(2, dtype=torch.half, device=dev), torch.arange(2, device=dev)
    return f + h, h * i, f.add_(torch.ones(2, dtype=torch.float64, device=dev)), torch.cat([h, f])


# ---------------------------------------------------------------- views
@case(fragment="view size is not compatible with input tensor's size and stride")
def view_of_transposed(dev):
    return matrix(dev).t().view(6)


@case(fragment="shape '[4]' is invalid for input of size 6")
def view_wrong_numel(dev):
    return matrix(dev).view(4)


@case(fragment="only one dimension can be inferred")
def view_two_inferred(dev):
    return matrix(dev).view(-1, -1)


@case()
def view_dtype_wrong_size(dev):
    return torch.ones(3, device=dev).view(torch.int64)


@case(fragment="must match the existing size")
def expand_wrong_size(dev):
    return matrix(dev).expand(4, 2)


# ---------------------------------------------------------------- empty tensors
@case()
def empty_sum_prod_amax_dim(dev):
    e = torch.zeros(0, 3, device=dev)
    return e.sum(), e.prod(), e.sum(0), e.amax(dim=1), e.argmax(dim=1)


@case(fragment="Expected reduction dim 0 to have non-zero size")
def empty_max_over_the_empty_dim(dev):
    return torch.zeros(0, 3, device=dev).max(dim=0)


@case()
def empty_argmax(dev):
    return torch.zeros(0, device=dev).argmax()


@case(modes=DEBUG_NAN)
def empty_mean(dev):
    return torch.zeros(0, device=dev).mean()


# ---------------------------------------------------------------- checkpoints
def _model(dev):
    torch.manual_seed(0)
    return nn.Linear(3, 2).to(dev)


@case(cpu_results=True)
def checkpoint_loaded_with_map_location_cpu(dev):
    buf = io.BytesIO()
    torch.save(_model(dev).state_dict(), buf)
    buf.seek(0)
    return dict(torch.load(buf, map_location="cpu"))


@case()
def checkpoint_roundtrip_keeps_views(dev):
    x = torch.arange(6.0, device=dev)
    buf = io.BytesIO()
    torch.save({"x": x, "tail": x[2:]}, buf)
    buf.seek(0)
    got = torch.load(buf)
    got["tail"][0] = -1.0  # still a view of x after loading: x sees the write
    return got["x"], got["tail"]


_LOAD_ALONE = r"""
import json, sys, torch
out = [sorted(k for k in sys.modules if k.startswith("torch_tpu"))]
sd = torch.load(sys.argv[1], map_location="cpu")
out.append([sd["w"].tolist(), sd["w"].device.type])
try:
    torch.load(sys.argv[1])
    out.append("loaded")
except Exception as e:
    out.append(type(e).__name__)
print(json.dumps(out))
"""


@case(ref="CUDA: map_location='cpu' loads a device checkpoint where the device is absent; "
      "without it, torch.load raises RuntimeError",
      expect=Returns(([], [[0.0, 1.0, 2.0], "cpu"], "RuntimeError")))
def checkpoint_loaded_where_tpu_is_not_imported(dev):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ckpt.pt")
        torch.save({"w": torch.arange(3.0, device=dev)}, path)
        env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONPATH="")
        out = subprocess.run([sys.executable, "-c", _LOAD_ALONE, path], env=env, text=True,
                             capture_output=True, timeout=120, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return tuple(got)


@case(cpu_results=True)
def load_state_dict_across_devices(dev):
    cpu_model = nn.Linear(3, 2)
    cpu_model.load_state_dict(_model(dev).state_dict())
    return cpu_model.weight, cpu_model.bias


@case(fragment="size mismatch for weight")
def load_state_dict_size_mismatch(dev):
    nn.Linear(3, 2).to(dev).load_state_dict(nn.Linear(3, 4).state_dict())


@case()
def deepcopy_and_pickle(dev):
    x = torch.arange(4.0, device=dev).requires_grad_()
    return copy.deepcopy(x), pickle.loads(pickle.dumps(x.detach())), copy.deepcopy(_model(dev)).weight


# ---------------------------------------------------------------- autograd
@case(fragment="Only Tensors of floating point and complex dtype can require gradients")
def integer_requires_grad(dev):
    return torch.ones(2, dtype=torch.long, device=dev, requires_grad=True)


@case(fragment="grad can be implicitly created only for scalar outputs")
def backward_of_non_scalar(dev):
    (torch.ones(2, device=dev, requires_grad=True) * 2).backward()


@case(fragment="Trying to backward through the graph a second time")
def backward_twice(dev):
    w = torch.ones(2, device=dev, requires_grad=True)
    loss = (w.exp() * 2).sum()
    loss.backward()
    loss.backward()


@case(fragment="a leaf Variable that requires grad is being used in an in-place operation")
def inplace_on_leaf(dev):
    torch.ones(2, device=dev, requires_grad=True).add_(1)


@case(fragment="does not require grad and does not have a grad_fn")
def backward_without_grad(dev):
    w = torch.ones(2, device=dev)
    with torch.no_grad():
        loss = (w * 2).sum()
    loss.backward()


@case(fragment="modified by an inplace operation")
def saved_tensor_modified_inplace(dev):
    y = torch.ones(2, device=dev, requires_grad=True).sigmoid()
    z = y * y
    y.mul_(2)
    z.sum().backward()


# ---------------------------------------------------------------- host conversions
@case(ref="CUDA: TypeError \"can't convert cuda:0 device type tensor to numpy\"",
      expect=Raises(TypeError, "device type tensor to numpy"))
def numpy_of_device_tensor(dev):
    return torch.ones(2, device=dev).numpy()


@case(fragment="a Tensor with 2 elements cannot be converted to Scalar")
def item_of_two_elements(dev):
    return torch.ones(2, device=dev).item()


@case(fragment="Boolean value of Tensor with more than one value is ambiguous")
def if_on_a_tensor(dev):
    return "yes" if torch.ones(2, device=dev) > 0 else "no"


@case()
def host_conversions(dev):
    t = torch.tensor([2.5, -1.0], device=dev)
    return float(t[0]), int(t[1]), t.tolist(), t[0].item(), bool(t[0] > 2), f"{t[1].item():.1f}"


# ---------------------------------------------------------------- the mode API
@case(ref="torch_tpu: an unknown mode name raises ValueError; the mode stays", expect=Raises(ValueError))
def unknown_mode_name(dev):
    import torch_tpu
    torch_tpu.set_eager_mode("fast")


@case(ref="torch_tpu: a mode that is not a name or an EagerMode raises TypeError",
      expect=Raises(TypeError))
def mode_of_the_wrong_type(dev):
    import torch_tpu
    with torch_tpu.eager_mode(3):
        pass


@case()
def nested_mode_contexts(dev):
    import torch_tpu
    x = torch.arange(3.0, device=dev)
    with torch_tpu.eager_mode("defer_and_fuse"):
        a = x * 2
        with torch_tpu.eager_mode("strict"):
            b = a + 1
            with torch_tpu.eager_mode("debug"):
                c = b * b
        d = c - a
    return a, b, c, d


@case()
def mode_block_left_by_an_exception(dev):
    import torch_tpu
    try:
        with torch_tpu.eager_mode("defer_and_fuse"):
            y = torch.arange(3.0, device=dev) * 2
            raise ValueError("user error")
    except ValueError:
        pass
    return y + 1


@case()
def set_mode_with_work_pending(dev):
    import torch_tpu
    before = torch_tpu.get_eager_mode()
    a = torch.arange(3.0, device=dev) * 3
    torch_tpu.set_eager_mode("strict")
    b = a + 1
    torch_tpu.set_eager_mode(before)
    return a, b * 2


# ---------------------------------------------------------------- interrupted and failed steps
@case(close=True)
def keyboard_interrupt_in_a_step(dev):
    model = _model(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(12.0, device=dev).view(4, 3) / 10
    interrupted = []

    def hook(module, args, out):
        if len(interrupted) == 0 and step == 1:
            interrupted.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the forward

    model.register_forward_hook(hook)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for step in range(4):
            try:
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
            except KeyboardInterrupt:
                continue
    finally:
        signal.signal(signal.SIGINT, old)
    return model.weight, model.bias, len(interrupted)


@case()
def shape_error_in_pending_work(dev):
    x = torch.arange(3.0, device=dev)
    a = x * 2
    b = a + 1
    try:
        a + torch.ones(5, device=dev)
    except RuntimeError:
        pass
    return a, b, b * 3


@case()
def index_error_in_pending_work(dev):
    x = torch.arange(3.0, device=dev)
    a = x * 2
    b = a + 1
    try:
        x[torch.tensor([9], device=dev)].sum().item()
    except (IndexError, RuntimeError):
        pass
    return a, b, b * 3


@case()
def lowering_error_in_pending_work(dev):
    x = torch.arange(6.0, device=dev).view(2, 3)
    a = x * 2
    try:
        a.softmax(dim=5)
    except IndexError:
        pass
    return a, a.sum()


@case()
def inplace_chain_around_an_error(dev):
    x = torch.arange(3.0, device=dev)
    x.add_(1)
    try:
        x.add_(torch.ones(5, device=dev))
    except RuntimeError:
        pass
    x.mul_(2)
    return x
