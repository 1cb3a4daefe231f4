"""Elementwise ops on tpu against CPU: values, torch's type promotion, special values,
activation gradients, the _foreach_* ops and the optimizers that use them; each in Strict
and in DeferAndFuse (the `eager` fixture)."""
import math

import pytest
import torch
import torch.nn.functional as F

from helpers.mode_matrix import parametrize

F32, BF16, I64, F64 = torch.float32, torch.bfloat16, torch.int64, torch.float64
FLOATS = (F32, BF16)
ALL = (F32, BF16, I64)

SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 2.5, 1e30, -1e-30]


def _tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def _cpu(x):
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(t) for t in x)
    return x.cpu() if isinstance(x, torch.Tensor) else x


def check(fn, *args, atol=None, rtol=None, **kwargs):
    """fn on CPU and on tpu give the same values and dtype."""
    expected = fn(*args, **kwargs)
    actual = _cpu(fn(*[_tpu(a) for a in args], **{k: _tpu(v) for k, v in kwargs.items()}))
    torch.testing.assert_close(actual, expected, equal_nan=True, atol=atol, rtol=rtol)


def make(shape, dtype, domain="any", seed=0):
    """A test tensor whose values lie in an op's domain."""
    g = torch.Generator().manual_seed(seed)
    if dtype == I64:
        lo, hi = {"any": (-6, 7), "pos": (1, 7), "nonneg": (0, 7)}.get(domain, (-6, 7))
        return torch.randint(lo, hi, shape, generator=g)
    u = torch.rand(shape, generator=g)
    x = {
        "any": lambda: torch.randn(shape, generator=g) * 2,
        "pos": lambda: u * 4 + 0.05,
        "nonneg": lambda: u * 4,
        "unit": lambda: u * 1.8 - 0.9,
        "ge1": lambda: u * 4 + 1,
        "prob": lambda: u * 0.9 + 0.05,
    }[domain]()
    return x.to(dtype)


# ---------------------------------------------------------------- unary ops
# (name, fn, domain, dtypes); int64 inputs check the int-to-float promotion
UNARY = [
    ("abs", torch.abs, "any", ALL),
    ("neg", torch.neg, "any", ALL),
    ("exp", torch.exp, "any", ALL),
    ("exp2", torch.exp2, "any", ALL),
    ("expm1", torch.expm1, "any", ALL),
    ("log", torch.log, "pos", ALL),
    ("log2", torch.log2, "pos", ALL),
    ("log10", torch.log10, "pos", ALL),
    ("log1p", torch.log1p, "pos", ALL),
    ("sqrt", torch.sqrt, "nonneg", ALL),
    ("rsqrt", torch.rsqrt, "pos", ALL),
    ("reciprocal", torch.reciprocal, "pos", ALL),
    ("sin", torch.sin, "any", ALL),
    ("cos", torch.cos, "any", ALL),
    ("tan", torch.tan, "unit", FLOATS),
    ("tanh", torch.tanh, "any", ALL),
    ("sigmoid", torch.sigmoid, "any", ALL),
    ("asin", torch.asin, "unit", FLOATS),
    ("acos", torch.acos, "unit", FLOATS),
    ("atan", torch.atan, "any", ALL),
    ("sinh", torch.sinh, "any", FLOATS),
    ("cosh", torch.cosh, "any", FLOATS),
    ("asinh", torch.asinh, "any", FLOATS),
    ("acosh", torch.acosh, "ge1", FLOATS),
    ("atanh", torch.atanh, "unit", FLOATS),
    ("erf", torch.erf, "any", ALL),
    ("erfc", torch.erfc, "any", FLOATS),
    ("erfinv", torch.erfinv, "unit", FLOATS),
    ("lgamma", torch.lgamma, "pos", FLOATS),
    ("digamma", torch.digamma, "pos", FLOATS),
    ("floor", torch.floor, "any", ALL),
    ("ceil", torch.ceil, "any", ALL),
    ("round", torch.round, "any", ALL),
    ("round_decimals", lambda x: torch.round(x * 100, decimals=-1), "any", (F32,)),
    ("trunc", torch.trunc, "any", ALL),
    ("frac", torch.frac, "any", FLOATS),
    ("sign", torch.sign, "any", ALL),
    ("sgn", torch.sgn, "any", ALL),
    ("signbit", torch.signbit, "any", ALL),
    ("square", torch.square, "any", ALL),
    ("logical_not", torch.logical_not, "any", ALL),
    ("bitwise_not", torch.bitwise_not, "any", (I64, torch.bool)),
    ("logical_not_bool", torch.logical_not, "any", (torch.bool,)),
    ("isnan", torch.isnan, "any", FLOATS),
    ("isfinite", torch.isfinite, "any", ALL),
    ("i0", torch.i0, "any", (F32,)),
    ("sinc", torch.sinc, "any", (F32,)),
    ("ndtri", torch.special.ndtri, "prob", (F32,)),
    ("erfcx", torch.special.erfcx, "any", (F32,)),
    ("trigamma", lambda x: torch.polygamma(1, x * 4), "any", (F32,)),
    ("polygamma3", lambda x: torch.polygamma(3, x * 4), "any", (F32,)),
]


def _cases(table, dtypes=None):
    """The mode_matrix entries of a table whose entries start with a name and end with their
    dtypes (or all take `dtypes`)."""
    if dtypes is not None:
        return [(e[0], e, dtypes) for e in table]
    return [(e[0], e[:-1], e[-1]) for e in table]


# ops whose float32 special functions differ from torch's own algorithms by a few ulp
LOOSE = {"lgamma", "digamma", "erfinv", "trigamma", "polygamma3", "erfcx", "i0"}


@parametrize("name,fn,domain,dtype", _cases(UNARY))
def test_unary(eager, name, fn, domain, dtype):
    x = make((3, 4), dtype, domain) if dtype != torch.bool else make((3, 4), F32) > 0
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == F32 and name in LOOSE else {}
    check(fn, x, **tol)


SPECIAL_UNARY = [torch.abs, torch.sign, torch.sgn, torch.floor, torch.round, torch.frac,
                 torch.exp, torch.log, torch.sqrt, torch.sigmoid, torch.tanh, torch.isinf,
                 torch.isposinf, torch.isneginf, torch.signbit, torch.nan_to_num,
                 lambda x: torch.nan_to_num(x, nan=1.0, posinf=2.0),
                 torch.digamma, torch.lgamma, torch.erfinv, torch.reciprocal, torch.angle]


@parametrize("name,fn,dtype", _cases([(f.__name__, f) for f in SPECIAL_UNARY], FLOATS))
def test_unary_special_values(eager, name, fn, dtype):
    check(fn, torch.tensor(SPECIALS, dtype=dtype))


# ---------------------------------------------------------------- binary ops
# (name, fn, domain of a, domain of b, dtypes)
BINARY = [
    ("add", torch.add, "any", "any", ALL),
    ("add_alpha", lambda a, b: torch.add(a, b, alpha=3), "any", "any", ALL),
    ("sub", torch.sub, "any", "any", ALL),
    ("rsub", torch.rsub, "any", "any", ALL),
    ("mul", torch.mul, "any", "any", ALL),
    ("div", torch.div, "any", "pos", ALL),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), "any", "pos", ALL),
    ("div_trunc", lambda a, b: torch.div(a, -b, rounding_mode="trunc"), "any", "pos", ALL),
    ("floor_divide", torch.floor_divide, "any", "pos", ALL),
    ("remainder", torch.remainder, "any", "pos", ALL),
    ("remainder_neg", lambda a, b: torch.remainder(a, -b), "any", "pos", ALL),
    ("fmod", torch.fmod, "any", "pos", ALL),
    ("pow", torch.pow, "pos", "any", FLOATS),
    ("pow_int", torch.pow, "any", "nonneg", (I64,)),
    ("atan2", torch.atan2, "any", "any", ALL),
    ("maximum", torch.maximum, "any", "any", ALL),
    ("minimum", torch.minimum, "any", "any", ALL),
    ("fmax", torch.fmax, "any", "any", ALL),
    ("fmin", torch.fmin, "any", "any", ALL),
    ("hypot", torch.hypot, "any", "any", FLOATS),
    ("copysign", torch.copysign, "any", "any", ALL),
    ("logaddexp", torch.logaddexp, "any", "any", FLOATS),
    ("logaddexp2", torch.logaddexp2, "any", "any", FLOATS),
    ("xlogy", torch.xlogy, "any", "pos", FLOATS),
    ("zeta", torch.special.zeta, "ge1", "any", (F32,)),
    ("bitwise_and", torch.bitwise_and, "any", "any", (I64,)),
    ("bitwise_or", torch.bitwise_or, "any", "any", (I64,)),
    ("bitwise_xor", torch.bitwise_xor, "any", "any", (I64,)),
    ("lshift", torch.bitwise_left_shift, "any", "nonneg", (I64,)),
    ("rshift", torch.bitwise_right_shift, "any", "nonneg", (I64,)),
    ("logical_and", torch.logical_and, "any", "any", ALL),
    ("logical_xor", torch.logical_xor, "any", "any", ALL),
    ("gcd", torch.gcd, "any", "any", (I64,)),
    ("lcm", torch.lcm, "any", "any", (I64,)),
    ("eq", torch.eq, "any", "any", ALL),
    ("ne", torch.ne, "any", "any", ALL),
    ("lt", torch.lt, "any", "any", ALL),
    ("le", torch.le, "any", "any", ALL),
    ("gt", torch.gt, "any", "any", ALL),
    ("ge", torch.ge, "any", "any", ALL),
]


@parametrize("name,fn,da,db,dtype", _cases(BINARY))
def test_binary(eager, name, fn, da, db, dtype):
    a = make((3, 4), dtype, da, seed=1)
    b = make((4,), dtype, db, seed=2)  # broadcast
    check(fn, a, b)
    # a Python number on the right (a 0-dim tensor for ops that only take tensors)
    scalar = b[1].item()
    if name in ("atan2", "hypot", "logaddexp", "logaddexp2", "fmax", "fmin", "maximum",
                "minimum", "logical_and", "logical_xor", "gcd", "lcm", "zeta"):
        check(fn, a, b[1].clone())
    else:
        check(fn, a, scalar)


# (description, fn, inputs): torch's promotion rules, each result's dtype checked by check()
PROMOTION = [
    ("int + float", lambda a: a + 2.5, [make((4,), I64)]),
    ("int32 + int64 0-dim", lambda a, b: a + b, [make((4,), I64).int(), torch.tensor(3)]),
    ("int * float64 0-dim", lambda a, b: a * b, [make((4,), I64), torch.tensor(0.1, dtype=F64)]),
    ("f32 * f64 0-dim", lambda a, b: a * b, [make((4,), F32), torch.tensor(0.1, dtype=F64)]),
    ("bf16 + float", lambda a: a + 1.1, [make((64,), BF16)]),
    ("bf16 * float", lambda a: a * 0.3, [make((64,), BF16)]),
    ("bf16 / float", lambda a: a / 0.3, [make((64,), BF16)]),
    ("float - bf16", lambda a: 0.3 - a, [make((64,), BF16)]),
    ("bf16 + f32", lambda a, b: a + b, [make((4,), BF16), make((4,), F32)]),
    ("int / int", lambda a, b: a / b, [make((4,), I64), make((4,), I64, "pos")]),
    ("int // negative", lambda a: a // -3, [torch.tensor([-7, -6, 0, 5, 7])]),
    ("int % negative", lambda a: a % -3, [torch.tensor([-7, -6, 0, 5, 7])]),
    ("int fmod", lambda a: torch.fmod(a, -3), [torch.tensor([-7, -6, 0, 5, 7])]),
    ("uint8 + int8", lambda a, b: a + b, [torch.tensor([200, 3], dtype=torch.uint8),
                                          torch.tensor([-1, 5], dtype=torch.int8)]),
    ("bool + bool", lambda a, b: a + b, [torch.tensor([True, False]), torch.tensor([True, True])]),
    ("bool * int", lambda a: a * 3, [torch.tensor([True, False])]),
    ("int ** float", lambda a: a ** 2.5, [make((4,), I64, "nonneg")]),
    ("int ** negative int tensor", lambda a, b: a ** b,
     [torch.tensor([2, -1, -1, 1, 0, 3, 3]), torch.tensor([-1, -3, -2, -5, -1, 40, 3])]),
    ("scalar ** int", lambda a: 2 ** a, [torch.tensor([0, 1, 5, 62])]),
    ("float scalar ** int", lambda a: 2.5 ** a, [torch.tensor([0, 1, -1, 5])]),
    ("float // 0", lambda a: a // 0.0, [torch.tensor([2.5, -2.5, 0.0])]),
    ("float % 0", lambda a: torch.remainder(a, 0.0), [torch.tensor([2.5, -2.5])]),
    ("int < float", lambda a: a < 2.5, [torch.tensor([1, 2, 3])]),
    ("bf16 > float rounds the float", lambda a: a > 1.1, [torch.tensor([1.1, 1.09], dtype=BF16)]),
    ("int sqrt", torch.sqrt, [torch.tensor([4, 9, 2])]),
    ("int where float", lambda c, a: torch.where(c, a, 0.5),
     [torch.tensor([True, False]), torch.tensor([1, 2])]),
    ("int clamp float", lambda a: torch.clamp(a, min=0.5), [torch.tensor([0, 2])]),
    ("shift out of range", lambda a, b: (a << b, a >> b),
     [torch.tensor([5, -5, 5, -5]), torch.tensor([64, 64, -1, 70])]),
    ("uint8 shift", lambda a: (a >> 9, a << 3), [torch.tensor([200, 7], dtype=torch.uint8)]),
    ("complex", lambda a, b: [torch.complex(a, b), torch.polar(a.abs(), b)],
     [make((4,), F32), make((4,), F32, seed=1)]),
    ("complex math", lambda z: [z * z, z.abs(), torch.sgn(z), z.conj_physical(), z + 1.5],
     [torch.complex(make((4,), F32), make((4,), F32, seed=1))]),
    ("masked_fill float into int", lambda a, m: a.masked_fill(m, 2.7),
     [torch.tensor([1, 2, 3]), torch.tensor([True, False, True])]),
]


@pytest.mark.parametrize("desc,fn,inputs", PROMOTION, ids=[p[0] for p in PROMOTION])
def test_promotion(eager, desc, fn, inputs):
    check(fn, *inputs)


def _divisions(x, row, scalar):
    # (the reference points of a detector: (i + 0.5) / W; a per-row and a scalar divisor,
    # and one that an earlier op of the same graph broadcasts)
    width = torch.linspace(0.5, 27.5, 28, device=x.device)[None] / (row * 28)
    return [width, x / scalar, x / 3.0, x / row, (x * 2 + 1) / row.T[:, :1],
            torch.tensor(-0.0, device=x.device) / scalar, x / float("inf"),
            x.bfloat16() / 3.0]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_division_by_a_broadcast_divisor_rounds_as_cpu(eager, compiled):
    """torch's division is correctly rounded; XLA rewrites `a / broadcast(b)` as
    `a * (1 / b)`, one ulp off for about a quarter of the elements, which a model whose
    gradient jumps at pixel centres (GroundingDINO) turns into a gradient 1000x CPU's
    distance from float64. Bit for bit, in both eager modes and compiled, for a divisor
    smaller than the result (a scalar, a column, a row)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 28, generator=g) * 37
    row = torch.rand(6, 1, generator=g) + 0.5
    scalar = torch.tensor(28.0)
    fn = torch.compile(_divisions, backend="tpu", fullgraph=True) if compiled else _divisions
    want = _divisions(x, row, scalar)
    got = [t.cpu() for t in fn(x.to("tpu"), row.to("tpu"), scalar.to("tpu"))]
    for i, (w, t) in enumerate(zip(want, got)):
        assert torch.equal(w, t) and torch.equal(w.signbit(), t.signbit()), \
            (i, (w != t).sum().item())


# ---------------------------------------------------------------- selection and fused ops
FUSED = [
    ("where", lambda a, b: torch.where(a > 0, a, b)),
    ("where_scalar", lambda a, b: torch.where(a > 0, a, 0.0)),
    ("clamp", lambda a, b: torch.clamp(a, -0.5, 0.7)),
    ("clamp_min", lambda a, b: torch.clamp(a, min=-0.5)),
    ("clamp_max", lambda a, b: a.clamp_max(0.2)),
    ("clamp_tensor", lambda a, b: torch.clamp(a, min=b, max=b + 1)),
    ("clamp_inverted", lambda a, b: torch.clamp(a, 1.0, -1.0)),
    ("lerp", lambda a, b: torch.lerp(a, b, 0.3)),
    ("lerp_high", lambda a, b: torch.lerp(a, b, 0.8)),
    ("lerp_tensor", lambda a, b: torch.lerp(a, b, torch.sigmoid(b))),
    ("addcmul", lambda a, b: torch.addcmul(a, a, b, value=0.5)),
    ("addcdiv", lambda a, b: torch.addcdiv(a, a, b.abs() + 1, value=-0.5)),
    ("masked_fill", lambda a, b: a.masked_fill(b > 0, -1.5)),
    ("masked_fill_tensor", lambda a, b: a.masked_fill(b > 0, torch.tensor(2.0))),
    ("masked_fill_inf", lambda a, b: a.masked_fill(b > 0, float("-inf"))),
    ("hardtanh", lambda a, b: F.hardtanh(a, -0.5, 0.5)),
    ("inplace_chain", lambda a, b: a.clone().mul_(2).add_(b, alpha=0.5).clamp_(-1, 1)),
]


@parametrize("name,fn,dtype", _cases(FUSED, FLOATS))
def test_fused(eager, name, fn, dtype):
    check(fn, make((3, 4), dtype, seed=3), make((4,), dtype, seed=4))


# ---------------------------------------------------------------- activations, forward and backward
ACTIVATIONS = [
    ("relu", F.relu),
    ("relu6", F.relu6),
    ("gelu", F.gelu),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
    ("silu", F.silu),
    ("mish", F.mish),
    ("hardtanh", F.hardtanh),
    ("hardsigmoid", F.hardsigmoid),
    ("hardswish", F.hardswish),
    ("elu", lambda x: F.elu(x, alpha=0.7)),
    ("celu", lambda x: F.celu(x, alpha=1.3)),
    ("selu", F.selu),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2)),
    ("softplus", lambda x: F.softplus(x, beta=2, threshold=3)),
    ("threshold", lambda x: F.threshold(x, 0.1, -2.0)),
    ("sigmoid", torch.sigmoid),
    ("tanh", torch.tanh),
    ("logsigmoid", F.logsigmoid),
    ("hardshrink", F.hardshrink),
    ("softshrink", F.softshrink),
    ("logit", lambda x: torch.logit(torch.sigmoid(x))),
    ("logit_eps", lambda x: torch.logit(torch.sigmoid(x * 3), eps=0.1)),
    ("prelu", lambda x: F.prelu(x, torch.full((4,), 0.25, dtype=x.dtype, device=x.device))),
]


@parametrize("name,fn,dtype", _cases(ACTIVATIONS, FLOATS))
def test_activation_forward_backward(eager, name, fn, dtype):
    x = make((3, 4), dtype, seed=5)
    x[0, :3] = torch.tensor([0.0, 3.0, -3.0])  # the kinks of relu/hardsigmoid/hardswish
    g = make((3, 4), dtype, seed=6)

    def run(device):
        xd = x.to(device).requires_grad_()
        y = fn(xd)
        (grad,) = torch.autograd.grad(y, xd, g.to(device))
        return y.detach().cpu(), grad.cpu()

    torch.testing.assert_close(run("tpu"), run("cpu"), equal_nan=True)


# backward of math ops: autograd's formulas run further pointwise ops on tpu
GRADS = [
    ("pow", lambda a, b: a.abs() ** b),
    ("pow_scalar", lambda a, b: a ** 3 * b),
    ("div", lambda a, b: a / (b.abs() + 1)),
    ("sqrt_exp_log", lambda a, b: torch.sqrt(a.abs() + 1) * torch.exp(b) + torch.log(b.abs() + 1)),
    ("atan2", torch.atan2),
    ("clamp", lambda a, b: torch.clamp(a, -0.5, 0.5) * b),
    ("where", lambda a, b: torch.where(a > b, a * b, a - b)),
    ("lerp_addcmul", lambda a, b: torch.addcmul(torch.lerp(a, b, 0.3), a, b, value=2)),
    ("maximum", torch.maximum),
]


@pytest.mark.parametrize("name,fn", GRADS, ids=[g[0] for g in GRADS])
def test_math_backward(eager, name, fn):
    a, b = make((3, 4), F32, seed=7), make((3, 4), F32, seed=8)

    def run(device):
        ad, bd = a.to(device).requires_grad_(), b.to(device).requires_grad_()
        y = fn(ad, bd)
        return [t.cpu() for t in torch.autograd.grad(y.sum(), (ad, bd))]

    torch.testing.assert_close(run("tpu"), run("cpu"))


# ---------------------------------------------------------------- foreach
def _chain_tol(dtype):
    """Tolerance for chains of bf16 ops. torch's CPU in-place ops (mul_(0.9)) round a
    scalar operand to bf16 while its out-of-place ones (and CUDA's) keep it in float32; we
    follow the latter, so results can differ by an ulp at a cancellation."""
    return dict(atol=1e-2, rtol=1.6e-2) if dtype == BF16 else {}


def _lists(dtype=F32, n=3, domain="any", seed=0):
    shapes = [(3, 4), (5,), ()][:n]
    return [make(s, dtype, domain, seed=seed + i) for i, s in enumerate(shapes)]


FOREACH = [
    ("add_list", lambda a, b: torch._foreach_add(a, b, alpha=0.5)),
    ("add_scalar", lambda a, b: torch._foreach_add(a, 1.5)),
    ("add_scalarlist", lambda a, b: torch._foreach_add(a, [1.0, 2, -3.5])),
    ("add_tensor", lambda a, b: torch._foreach_add(a, b[2], alpha=2)),
    ("sub_list", lambda a, b: torch._foreach_sub(a, b)),
    ("mul_list", lambda a, b: torch._foreach_mul(a, b)),
    ("mul_tensor", lambda a, b: torch._foreach_mul(a, b[2])),
    ("div_scalarlist", lambda a, b: torch._foreach_div(a, [2.0, 3.0, 4.0])),
    ("div_tensor", lambda a, b: torch._foreach_div(a, b[2].abs() + 1)),
    ("addcmul_scalar", lambda a, b: torch._foreach_addcmul(a, a, b, 0.5)),
    ("addcmul_tensor", lambda a, b: torch._foreach_addcmul(a, a, b, torch.tensor([0.1, 0.2, 0.3]))),
    ("addcdiv_scalarlist", lambda a, b: torch._foreach_addcdiv(
        a, a, [t.abs() + 1 for t in b], [0.1, -0.2, 0.3])),
    ("lerp_scalar", lambda a, b: torch._foreach_lerp(a, b, 0.1)),
    ("lerp_list", lambda a, b: torch._foreach_lerp(a, b, [torch.sigmoid(t) for t in b])),
    ("maximum_list", lambda a, b: torch._foreach_maximum(a, b)),
    ("clamp_min_scalar", lambda a, b: torch._foreach_clamp_min(a, 0.1)),
    ("pow_scalar", lambda a, b: torch._foreach_pow([t.abs() for t in a], 1.5)),
    ("pow_scalar_and_tensor", lambda a, b: torch._foreach_pow(2.0, a)),
    ("unary", lambda a, b: [torch._foreach_sqrt([t.abs() for t in a]), torch._foreach_neg(a),
                            torch._foreach_abs(a), torch._foreach_exp(a), torch._foreach_sign(a),
                            torch._foreach_reciprocal(b), torch._foreach_sigmoid(a)]),
    ("norm", lambda a, b: [torch._foreach_norm(a), torch._foreach_norm(a, 1),
                           torch._foreach_norm(a, float("inf")), torch._foreach_norm(a, 3)]),
    ("max_powsum", lambda a, b: [torch._foreach_max(a), torch._foreach_powsum(a, 2)]),
    ("inplace", lambda a, b: [torch._foreach_mul_(a, 0.9), torch._foreach_addcmul_(a, b, b, 0.1),
                              torch._foreach_zero_(b), a, b]),
    ("copy_", lambda a, b: [torch._foreach_copy_(b, a), b]),
]


FOREACH_XFAIL = {
    "addcmul_tensor": pytest.mark.xfail(
        reason="torch requires the `scalars` tensor on CPU; the executor rejects CPU tensors"),
}


@parametrize("name,fn,dtype", _cases(FOREACH, FLOATS), FOREACH_XFAIL)
def test_foreach(eager, name, fn, dtype):
    a, b = _lists(dtype, seed=10), _lists(dtype, seed=20)

    def run(device):
        return _cpu(fn([t.to(device) for t in a], [t.to(device) for t in b]))

    torch.testing.assert_close(run("tpu"), run("cpu"), **_chain_tol(dtype))


def test_foreach_is_one_program(eager):
    """A foreach op over many tensors compiles and dispatches (or records) once, not once
    per tensor."""
    import torch_tpu
    from torch_tpu import metrics

    host = [make((4, 4), F32, seed=i) for i in range(8)]
    params = [p.to("tpu") for p in host]
    torch._foreach_mul_(params, 0.5)  # warm up the cache
    before = metrics.counters.copy()
    torch._foreach_mul_(params, 0.25)
    grew = metrics.counters - before
    assert grew[f"dispatches.{torch_tpu.get_eager_mode().value}"] == 1
    assert grew["cache_misses"] == 0
    torch.testing.assert_close([p.cpu() for p in params], [p * 0.125 for p in host])


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_foreach_inplace_into_views_of_one_storage(mode):
    """FSDP2 copies every parameter shard into slices of one flat buffer with one
    _foreach_copy_: each write must survive the others (they share the storage)."""
    import torch_tpu

    def run(device):
        flat = torch.zeros(12, device=device)
        dsts = torch.split(flat[2:], [6, 4])
        srcs = [torch.arange(6.0, device=device), torch.arange(10.0, 14.0, device=device)]
        torch._foreach_copy_(list(dsts), srcs)
        torch._foreach_mul_([flat[:2], flat[2:5], flat[8:]], [3.0, 2.0, -1.0])
        return flat.cpu()

    with torch_tpu.eager_mode(mode):
        torch.testing.assert_close(run("tpu"), run("cpu"))


# ---------------------------------------------------------------- optimizers (default foreach path)
def _params_and_grads(dtype, steps):
    g = torch.Generator().manual_seed(0)
    shapes = [(8, 4), (8,), (3, 8), (3,)]
    params = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    grads = [[torch.randn(s, generator=g).to(dtype) for s in shapes] for _ in range(steps)]
    return params, grads


OPTIMIZERS = [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1), (F32,)),
    ("sgd_momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=0.01), (F32, BF16)),
    ("adam", lambda p: torch.optim.Adam(p, lr=0.01), (F32,)),
    ("adam_amsgrad", lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True, weight_decay=0.1),
     (F32,)),
    ("adamw", lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1), (F32, BF16)),
]


class _TorchCalls(torch.overrides.TorchFunctionMode):
    """Records the names of the torch functions called inside it."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


@parametrize("name,make_opt,dtype", _cases(OPTIMIZERS))
def test_optimizer_foreach_steps(eager, name, make_opt, dtype):
    params, grads = _params_and_grads(dtype, steps=3)

    def run(device):
        ps = [p.to(device).requires_grad_() for p in params]
        opt = make_opt(ps)
        calls = _TorchCalls()
        for step_grads in grads:
            for p, gr in zip(ps, step_grads):
                p.grad = gr.to(device)
            with calls:
                opt.step()
        if device == "tpu":  # torch's default for a foreach-capable device: the foreach path
            assert any(n.startswith("_foreach_") for n in calls.names), calls.names
        return [p.detach().cpu() for p in ps]

    torch.testing.assert_close(run("tpu"), run("cpu"), **_chain_tol(dtype))


def test_clip_grad_norm_foreach(eager):
    params, grads = _params_and_grads(F32, 1)

    def run(device):
        ps = [p.to(device).requires_grad_() for p in params]
        for p, gr in zip(ps, grads[0]):
            p.grad = gr.to(device) * 10
        norm = torch.nn.utils.clip_grad_norm_(ps, max_norm=1.0, foreach=True)
        return norm.cpu(), [p.grad.cpu() for p in ps]

    torch.testing.assert_close(run("tpu"), run("cpu"))
