"""torchao's float8 training (`convert_to_float8_training`) on tpu, as its README has a user
write it: the nn.Linear layers become Float8Linear, whose forward and both backward products
run through `torch._scaled_mm` with dynamically computed tensor-wise or row-wise scales.
Losses over a few SGD steps match the same script on CPU (torchao's emulation there is the
same dequantised float32 product), in each eager mode and compiled."""
import pytest
from helpers.user_script import run_script

pytest.importorskip("torchao")

BODY = r'''
import warnings
warnings.filterwarnings("ignore")
import torch.nn as nn
from torchao.float8 import Float8LinearConfig, convert_to_float8_training


def train(device, recipe, compiled):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128))
    x, target = torch.randn(64, 256), torch.randn(64, 128)
    convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe))
    m, x, target = m.to(device), x.to(device), target.to(device)
    step = torch.compile(m, backend="tpu" if device == "tpu" else "aot_eager") if compiled else m
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        loss = (step(x) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["kinds"] = sorted({type(c).__name__ for c in m.children()})
    return losses


for recipe in RECIPES:
    out[recipe] = {"cpu": train("cpu", recipe, COMPILED), "tpu": train("tpu", recipe, COMPILED)}
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode,compiled", [("strict", False), ("defer_and_fuse", False),
                                           ("strict", True)], ids=["strict", "defer", "compiled"])
def test_float8_training_matches_cpu(mode, compiled):
    recipes = ["tensorwise", "rowwise"] if not compiled else ["tensorwise"]
    out = run_script(BODY, mode, limit=None,
                     prelude=f"RECIPES = {recipes!r}\nCOMPILED = {compiled!r}\n")
    assert out["kinds"] == ["Float8Linear", "ReLU"]
    for recipe in recipes:
        cpu, tpu = out[recipe]["cpu"], out[recipe]["tpu"]
        assert cpu[-1] < cpu[0]
        assert tpu == pytest.approx(cpu, rel=1e-4), recipe
