"""The Python package `lossfns`: opcheck of every op, torch.compile of a training step against
eager, the fake kernels' sign layout against the library's, and `pip install` into a fresh
virtualenv. CUDA cases skip without a GPU.

Run by ctest (tests/CMakeLists.txt) with PYTHONPATH=python and LOSSFNS_LIBRARY=<build>/lib/liblossfns.so.
"""
from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

import lossfns
from lossfns import _fake
from lossfns._ops import DIVERGENCES, REDUCTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


def inputs(shape, dtype, device, labels="some"):
    """p, q with every kind of tie: q equals p in about half the elements, and a tail of 13
    vocabulary slots is 0.0 in both (padding). V = 300: not a multiple of a tile or vector width.
    labels: None, "some" (a third of the rows ignored) or "all" (every row ignored)."""
    g = torch.Generator().manual_seed(0)
    *lead, V = shape
    p = torch.softmax(torch.randn(*lead, V, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(*lead, V, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.where(torch.rand(*lead, V, generator=g) < 0.5, p, q)
    p[..., -13:] = 0.0
    q[..., -13:] = 0.0
    lab = None
    if labels is not None:
        lab = torch.randint(0, V, tuple(lead), generator=g)
        lab.view(-1)[:: 3 if labels == "some" else 1] = -100
        lab = lab.to(device)
    return p.to(device, dtype), q.to(device, dtype), lab


CASES = [(shape, dtype, red, "some") for shape in [(7, 300), (2, 3, 300)]
         for dtype in [torch.float32, torch.bfloat16] for red in REDUCTIONS]
CASES += [((7, 300), torch.float32, red, None) for red in REDUCTIONS]
CASES += [((7, 300), torch.float32, red, "all") for red in ("batchmean", "mean")]
CASE_IDS = [f"{'x'.join(map(str, s))}-{str(d)[6:]}-{r}-labels_{l}" for s, d, r, l in CASES]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,dtype,reduction,labels", CASES, ids=CASE_IDS)
def test_opcheck_every_op(device, shape, dtype, reduction, labels):
    p, q, lab = inputs(shape, dtype, device, labels)
    pg, qg = p.clone().requires_grad_(), q.clone().requires_grad_()
    torch.library.opcheck(torch.ops.lossfns.tvd_loss.default, (pg, qg, lab, -100, reduction))  # autograd
    torch.library.opcheck(torch.ops.lossfns.tvd_loss.default, (p, q, lab, -100, reduction))  # no grad: all checks
    code = REDUCTIONS.index(reduction)
    # The CUDA forward's packed signs leave bytes unwritten by design (the tie bits of tiles
    # without ties, the padding of each region): backward never reads them, but they make the
    # signs output differ between two calls, which opcheck's eager-vs-AOT comparison rejects.
    # The public op above covers the CUDA forward and backward under AOT.
    for save_signs in (False, True) if device == "cpu" else (False,):
        torch.library.opcheck(torch.ops.lossfns._tvd_forward.default, (p, q, lab, -100, code, save_signs))
    loss, signs, scale = torch.ops.lossfns._tvd_forward(p, q, lab, -100, code, True)
    grad_out = torch.rand_like(loss) if reduction == "none" else torch.tensor(0.75, device=device)
    torch.library.opcheck(torch.ops.lossfns._tvd_backward.default,
                          (grad_out, signs, scale, p, q, lab, -100, shape[-1], dtype, code))


def eager_and_aot(fn, leaves, dynamic):
    """fn(*leaves) -> loss, run eagerly and compiled with aot_eager (fullgraph), each on fresh
    requires-grad copies of the leaves and backward with grad_output 0.5: {"eager" | "aot": (loss,
    the leaves' gradients...)}."""
    out = {}
    for name, f in [("eager", fn), ("aot", torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=dynamic))]:
        xs = [x.clone().requires_grad_() for x in leaves]
        loss = f(*xs)
        loss.backward(torch.ones_like(loss) * 0.5)
        out[name] = (loss.detach(), *(x.grad for x in xs))
    return out


def assert_aot_matches_eager(out):
    for a, b in zip(out["eager"], out["aot"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same kernels on the same inputs


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_aot_shapes_match_eager(reduction, dynamic):
    """Forward and backward traced through the fake kernels (aot_eager: no code generation), with
    static and with symbolic shapes, give eager's numbers."""
    p, q, lab = inputs((2, 3, 300), torch.float32, "cpu")
    out = eager_and_aot(lambda p, q: lossfns.tvd_loss(p, q, lab, -100, reduction), (p, q), dynamic)
    assert_aot_matches_eager(out)
    ties = p == q
    assert bool((out["aot"][1][ties] == 0).all()), "a tie got a non-zero gradient"


def test_code_order_matches_library():
    # The internal ops take a reduction's and a divergence's index in lossfns._ops.REDUCTIONS /
    # DIVERGENCES as its integer code: each code must compute what the public op computes for
    # its name (the four reductions and the four divergences all give different values here).
    g = torch.Generator().manual_seed(1)
    p = torch.rand(3, 7, generator=g, dtype=torch.float64).softmax(-1)
    q = torch.rand(3, 7, generator=g, dtype=torch.float64).softmax(-1)
    for code, name in enumerate(REDUCTIONS):
        want = lossfns.tvd_loss(p, q, reduction=name)
        got = torch.ops.lossfns._tvd_forward(p, q, None, -100, code, False)[0].view(want.shape)
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"reduction code {code} is not {name!r}")
    s, t = torch.randn(3, 7, generator=g, dtype=torch.float64), torch.randn(3, 7, generator=g, dtype=torch.float64)
    for code, name in enumerate(DIVERGENCES):
        want = lossfns.distill_loss(s, t, divergence=name, beta=0.3, reduction="sum")
        got = torch.ops.lossfns._distill_forward(s, t, None, code, 0.3, 1.0, -100, REDUCTIONS.index("sum"), 7,
                                                 None, False)[0]
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"divergence code {code} is not {name!r}")


def test_fake_sign_pitch_matches_library():
    # The CPU forward returns (0, sign_row_pitch(V)) signs: the library's own pitch for any V.
    for V in [1, 7, 128, 255, 256, 257, 300, 4096, 32000, 32768, 50257, 128256, 151936]:
        p = torch.full((1, V), 1.0 / V)
        _, signs, _ = torch.ops.lossfns._tvd_forward(p, p, None, -100, REDUCTIONS.index("batchmean"), True)
        assert signs.shape == (0, _fake.sign_row_pitch(V)), V


def _train_setup():
    torch.manual_seed(0)
    B, T, H, V = 2, 5, 16, 300
    model = torch.nn.Linear(H, V)
    x = torch.randn(B, T, H)
    q = torch.softmax(torch.randn(B, T, V), -1)
    labels = torch.randint(0, V, (B, T))
    labels[0, 1] = -100
    return model, x, q, labels


# Compiled vs eager: the loss is the same kernel on the same p up to inductor's fused softmax
# (a few fp32 ulp), and one SGD step of lr 0.5 moves weights of size <= 0.25 by at most ~0.5*|grad|:
# 1e-6 absolute is ~10 ulp of the weights and far below any real difference.
TOL = dict(rtol=1e-6, atol=1e-6)


def test_compile_fullgraph_forward_and_loss_then_backward_and_sgd():
    """The usual pattern: the model and the loss compiled as one graph (fullgraph=True), its AOT
    backward graph run by loss.backward(), then torch.optim.SGD."""
    model, x, q, labels = _train_setup()
    loss_fn = lossfns.TVDLoss()

    def forward(m, x, q, labels):
        return loss_fn(torch.softmax(m(x), -1), q, labels)

    results = {}
    for name, fwd in [("eager", forward), ("compiled", torch.compile(forward, fullgraph=True))]:
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        losses = []
        for _ in range(2):
            loss = fwd(m, x, q, labels)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        results[name] = (torch.stack(losses), m.weight.detach(), m.bias.detach())
    for a, b in zip(results["eager"], results["compiled"]):
        torch.testing.assert_close(b, a, **TOL)


def test_compile_fullgraph_whole_training_step():
    """The whole step in one graph: forward, loss, torch.autograd.grad and an SGD update
    (torch.optim's step breaks the graph on purpose; Dynamo traces autograd.grad with
    trace_autograd_ops)."""
    model, x, q, labels = _train_setup()
    loss_fn = lossfns.TVDLoss(reduction="sum")

    def make_step(m):
        def step(x, q, labels):
            loss = loss_fn(torch.softmax(m(x), -1), q, labels)
            gw, gb = torch.autograd.grad(loss, [m.weight, m.bias])
            with torch.no_grad():
                m.weight.sub_(0.05 * gw)
                m.bias.sub_(0.05 * gb)
            return loss.detach()
        return step

    m_eager, m_comp = copy.deepcopy(model), copy.deepcopy(model)
    eager = make_step(m_eager)(x, q, labels)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(make_step(m_comp), fullgraph=True)(x, q, labels)
    torch.testing.assert_close(compiled, eager, **TOL)
    torch.testing.assert_close(m_comp.weight, m_eager.weight, **TOL)
    torch.testing.assert_close(m_comp.bias, m_eager.bias, **TOL)
    assert not torch.equal(m_comp.weight, model.weight), "the step did not move the weights"


def test_module_and_function_agree_and_validate():
    p, q, lab = inputs((7, 300), torch.float32, "cpu")
    for red in REDUCTIONS:
        torch.testing.assert_close(lossfns.TVDLoss(reduction=red, ignore_index=-100)(p, q, lab),
                                   lossfns.tvd_loss(p, q, lab, reduction=red), rtol=0, atol=0)
    with pytest.raises(ValueError, match="reduction must be one of"):
        lossfns.TVDLoss(reduction="avg")
    with pytest.raises(TypeError):
        lossfns.TVDLoss("sum")  # keyword-only: Liger's positional order differs
    with pytest.raises(RuntimeError, match="q must have p's shape"):
        lossfns.tvd_loss(p, q[:, :-1])
    assert lossfns.__version__.count(".") == 2


def test_pip_install_into_fresh_virtualenv(tmp_path):
    """pip install --no-build-isolation --no-deps <tree> into a new virtualenv, offline, made as
    the docs say (scripts/venv_with_torch.sh): torch and scikit-build-core come from this Python's
    site-packages through a .pth file. The library is built again, CPU-only, in a temporary build
    directory."""
    venv = tmp_path / "venv"
    made = subprocess.run(["bash", os.path.join(ROOT, "scripts", "venv_with_torch.sh"), str(venv), sys.executable],
                          capture_output=True, text=True)
    assert made.returncode == 0, f"venv_with_torch.sh failed:\n{made.stdout}\n{made.stderr}"
    assert f"sees torch {torch.__version__}" in made.stdout, made.stdout
    # A directory that exists is refused, and left as it was.
    again = subprocess.run(["bash", os.path.join(ROOT, "scripts", "venv_with_torch.sh"), str(venv), sys.executable],
                           capture_output=True, text=True)
    assert again.returncode == 1 and "already exists" in again.stderr, again.stderr
    vpy = str(venv / "bin" / "python")
    vsite = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           check=True, capture_output=True, text=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOSSFNS_LIBRARY", "PYTHONHOME")}
    env.update(CMAKE_ARGS="-DLOSSFNS_CUDA=OFF", SKBUILD_BUILD_DIR=str(tmp_path / "build"),
               CMAKE_BUILD_PARALLEL_LEVEL="2", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    t0 = time.monotonic()
    build = subprocess.run([vpy, "-m", "pip", "install", "--no-build-isolation", "--no-deps", ROOT],
                           env=env, cwd=tmp_path, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    assert build.returncode == 0, f"pip install failed:\n{build.stdout[-6000:]}\n{build.stderr[-6000:]}"
    print(f"pip install --no-build-isolation --no-deps: {seconds:.0f} s")

    check = textwrap.dedent(f"""
        import os, torch, lossfns
        site = {vsite!r}
        assert lossfns.__file__.startswith(site), lossfns.__file__
        assert lossfns.__library__ == os.path.join(site, "lossfns", "liblossfns.so"), lossfns.__library__
        libs = [f for f in os.listdir(os.path.dirname(lossfns.__library__)) if ".so" in f]
        assert libs == ["liblossfns.so"], libs  # one file: no soname copies in the wheel
        maps = open("/proc/self/maps").read()
        assert lossfns.__library__ in maps, "the installed library is not mapped"
        assert {ROOT!r} + "/build" not in maps, "a library from the build tree is mapped"
        p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], requires_grad=True)
        q = torch.tensor([[0.25, 0.75, 0.0], [0.2, 0.3, 0.5]])
        loss = lossfns.tvd_loss(p, q)
        loss.backward()
        assert abs(loss.item() - 0.125) < 1e-7, loss  # (0.5*0.5 + 0) / 2 rows
        assert p.grad[1].eq(0).all() and p.grad[0, 2] == 0, p.grad  # ties: exactly 0
        print("ok", lossfns.__version__, lossfns.__library__)
    """)
    run = subprocess.run([vpy, "-c", check], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, f"import in the fresh venv failed:\n{run.stdout}\n{run.stderr[-6000:]}"
    assert run.stdout.startswith("ok "), run.stdout


# --- lossfns.distill_loss -----------------------------------------------------------------------


def logits(shape, dtype, device, labels="some", wt=None):
    """Student and teacher logits with ties: the teacher equals the student in half the rows, and
    a tail of 13 columns is -inf in both; V = 300 (not a vector width). wt: the teacher's width."""
    g = torch.Generator().manual_seed(0)
    *lead, V = shape
    s = torch.randn(*lead, V, generator=g, dtype=torch.float64) * 2
    t = torch.randn(*lead, wt or V, generator=g, dtype=torch.float64) * 2
    n = min(V, wt or V)
    t.view(-1, t.shape[-1])[::2, :n] = s.view(-1, V)[::2, :n]
    s[..., n - 13:n] = float("-inf")
    t[..., n - 13:n] = float("-inf")
    lab = None
    if labels is not None:
        lab = torch.randint(0, V, tuple(lead), generator=g)
        lab.view(-1)[:: 3 if labels == "some" else 1] = -100
        lab = lab.to(device)
    return s.to(device, dtype), t.to(device, dtype), lab


DCASES = [(shape, dtype, red, div) for shape in [(7, 300), (2, 3, 300)] for dtype in [torch.float32, torch.bfloat16]
          for red in REDUCTIONS for div in DIVERGENCES]
DCASE_IDS = [f"{'x'.join(map(str, s))}-{str(d)[6:]}-{r}-{v}" for s, d, r, v in DCASES]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,dtype,reduction,divergence", DCASES, ids=DCASE_IDS)
def test_opcheck_distill_ops(device, shape, dtype, reduction, divergence):
    s, t, lab = logits(shape, dtype, device)
    sg = s.clone().requires_grad_()
    op = torch.ops.lossfns.distill_loss.default
    args = (lab, divergence, 0.3, 1.5, -100, reduction, 290)
    torch.library.opcheck(op, (sg, t) + args)  # autograd
    torch.library.opcheck(op, (s, t) + args)  # no grad: every check
    gs = torch.tensor([0.75], device=device)
    torch.library.opcheck(op, (sg, t) + args + (gs,))  # the gradient computed in forward on CUDA
    code, red = DIVERGENCES.index(divergence), REDUCTIONS.index(reduction)
    for grad_scale in (None, gs):
        for save in (False, True):
            torch.library.opcheck(torch.ops.lossfns._distill_forward.default,
                                  (s, t, lab, code, 0.3, 1.5, -100, red, 290, grad_scale, save))
    loss, stats, scale, _ = torch.ops.lossfns._distill_forward(s, t, lab, code, 0.3, 1.5, -100, red, 290, None, True)
    grad_out = torch.rand_like(loss) if reduction == "none" else torch.tensor(0.75, device=device)
    torch.library.opcheck(torch.ops.lossfns._distill_backward.default,
                          (grad_out, s, t, lab, stats, scale, code, 0.3, 1.5, -100, red, 290))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_distill_aot_matches_eager(divergence, dynamic):
    s, t, lab = logits((2, 3, 300), torch.float32, "cpu", wt=280)
    fn = lambda s: lossfns.distill_loss(s, t, lab, divergence, temperature=2.0, vocab_size=280)  # noqa: E731
    assert_aot_matches_eager(eager_and_aot(fn, (s,), dynamic))


def test_compile_fullgraph_distillation_step():
    """A student Linear distilled from a fixed teacher's logits, model + loss in one compiled
    graph, against eager."""
    torch.manual_seed(0)
    student, teacher = torch.nn.Linear(16, 300), torch.nn.Linear(16, 300)
    x = torch.randn(2, 5, 16)
    labels = torch.randint(0, 300, (2, 5))
    loss_fn = lossfns.DistillLoss(divergence="jsd", beta=0.4, temperature=2.0)

    def forward(m, x):
        with torch.no_grad():
            t = teacher(x)
        return loss_fn(m(x), t, labels)

    results = {}
    for name, fwd in [("eager", forward), ("compiled", torch.compile(forward, fullgraph=True))]:
        m = copy.deepcopy(student)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        losses = []
        for _ in range(2):
            loss = fwd(m, x)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        results[name] = (torch.stack(losses), m.weight.detach())
    for a, b in zip(results["eager"], results["compiled"]):
        torch.testing.assert_close(b, a, **TOL)


def test_distill_module_function_and_errors():
    s, t, lab = logits((7, 300), torch.float32, "cpu")
    for div in DIVERGENCES:
        for red in REDUCTIONS:
            torch.testing.assert_close(lossfns.DistillLoss(divergence=div, reduction=red)(s, t, lab),
                                       lossfns.distill_loss(s, t, lab, div, reduction=red), rtol=0, atol=0)
    assert "divergence='jsd', beta=0.5" in repr(lossfns.DistillLoss(divergence="jsd"))
    with pytest.raises(ValueError, match="divergence must be one of"):
        lossfns.DistillLoss(divergence="kl")
    with pytest.raises(RuntimeError, match="divergence must be one of 'tvd', 'forward_kl', 'reverse_kl', 'jsd'; got 'kl'"):
        lossfns.distill_loss(s, t, divergence="kl")
    # grad_scale: one floating-point value on the logits' device, checked on the CPU too (which does
    # not use it), without grad, and by the fake kernel (called here on fake tensors alone: under
    # torch.compile the real kernel would raise the same error when the fake one did not).
    message = "grad_scale must be a 1-element floating-point tensor"
    for bad in (torch.ones(2), torch.ones(1, dtype=torch.long)):
        with pytest.raises(RuntimeError, match=message):
            lossfns.distill_loss(s.detach().requires_grad_(), t, grad_scale=bad)
        with pytest.raises(RuntimeError, match=message):
            lossfns.distill_loss(s.detach(), t, grad_scale=bad)
        with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
            fs, ft, fbad = (mode.from_tensor(x) for x in (s, t, bad))
            with pytest.raises(RuntimeError, match=message):
                _fake._distill_forward_fake(fs, ft, None, 0, 0.5, 1.0, -100, 3, 300, fbad, True)
    with pytest.raises(RuntimeError, match="teacher_logits must not require grad"):
        lossfns.distill_loss(s.requires_grad_(), t.clone().requires_grad_())


def test_a_second_copy_of_the_library_is_refused_not_aborted(tmp_path):
    """torch.ops.load_library of one copy, then the package with another: an ImportError naming both
    (the second copy's registrations would abort the process); the same file twice is fine."""
    library = os.path.realpath(os.environ["LOSSFNS_LIBRARY"])
    copy_path = tmp_path / "liblossfns_copy.so"
    copy_path.write_bytes(open(library, "rb").read())
    script = textwrap.dedent(f"""
        import os, torch
        torch.ops.load_library({library!r})
        os.environ["LOSSFNS_LIBRARY"] = {str(copy_path)!r}
        try:
            import lossfns
        except ImportError as e:
            print("refused:", e)
        os.environ["LOSSFNS_LIBRARY"] = {library!r}
        import lossfns
        print("loaded", lossfns.__version__)
        """)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"refused: lossfns: torch.ops.lossfns is already registered in this process (by {library})" in run.stdout
    assert str(copy_path) in run.stdout and "\nloaded " in run.stdout


def test_modules_check_their_numbers_when_built():
    """Every argument the op would refuse at the first call is refused when the module is built."""
    bad = [(lossfns.DistillLoss, dict(temperature=0.0), "temperature must be > 0"),
           (lossfns.DistillLoss, dict(temperature=-1.0), "temperature must be > 0"),
           (lossfns.DistillLoss, dict(temperature=float("nan")), "temperature must be > 0"),
           (lossfns.DistillLoss, dict(temperature=1e-39), "temperature must be > 0"),
           (lossfns.DistillLoss, dict(divergence="jsd", beta=2.0), "beta must be in"),
           (lossfns.DistillLoss, dict(temperature=torch.tensor(2.0)),
            r"temperature must be a Python number \(float\(t\) of a 0-dim tensor\); got tensor\(2\.\)"),
           (lossfns.DistillLoss, dict(divergence="jsd", beta="0.5"), "beta must be a Python number; got '0.5'"),
           (lossfns.DistillLoss, dict(vocab_size=0), "vocab_size must be an int >= 1"),
           (lossfns.DistillLoss, dict(ignore_index="x"), "ignore_index must be an int"),
           (lossfns.CrossEntropyLoss, dict(vocab_size=0), "vocab_size must be an int >= 1"),
           (lossfns.TVDLoss, dict(ignore_index=1.5), "ignore_index must be an int"),
           (lossfns.TVDLoss, dict(ignore_index=2**63), "ignore_index must be an int that fits in 64 bits"),
           (lossfns.CrossEntropyLoss, dict(vocab_size=2**63), "vocab_size must be an int >= 1 that fits")]
    for cls, kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            cls(**kwargs)
    lossfns.DistillLoss(divergence="tvd", beta=2.0)  # beta is read by jsd only (as the op does)
    lossfns.DistillLoss(temperature=1e-3, vocab_size=5, ignore_index=-1)


def test_what_the_schema_cannot_say_is_said_by_the_functions():
    """Labels or an input on another device than the logits (meta: the dispatcher then picks the
    fake kernels, whose empty outputs were taken for the loss), an input that is None, sparse or
    nested, an int past int64, a bool for a number and a number given as a tensor that requires
    grad (it would get no gradient) are errors naming them."""
    s, t = torch.randn(4, 10, requires_grad=True), torch.randn(4, 10)
    meta = torch.tensor([1, 2, -100, 3], device="meta")
    p, q = t.softmax(-1), t.softmax(-1)
    sh, sw, th, tw, _ = hidden_states((4,), torch.float32, "cpu")
    on_meta = r"labels must be on the device of {}, cpu; got meta"
    jagged = torch.nested.nested_tensor([torch.randn(2, 10), torch.randn(3, 10)], layout=torch.jagged)

    def qint8(x):
        return torch.quantize_per_tensor(x.detach(), 0.1, 0, torch.qint8)

    cases = [
        (lambda: lossfns.distill_loss(s, t, meta), on_meta.format("student_logits")),
        (lambda: lossfns.distill_loss(s.detach(), t, meta), on_meta.format("student_logits")),
        (lambda: lossfns.tvd_loss(p, q, meta), on_meta.format("p")),
        (lambda: lossfns.cross_entropy_loss(s, meta), on_meta.format("logits")),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, th, tw, meta), on_meta.format("student_hidden")),
        (lambda: lossfns.distill_loss(s, None), "student_logits and teacher_logits must be defined tensors"),
        (lambda: lossfns.tvd_loss(p.requires_grad_(), None), "p and q must be defined tensors"),
        (lambda: lossfns.cross_entropy_loss(s, None), "logits and labels must be defined tensors"),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, None, tw),
         "the hidden states and lm_heads must be defined tensors"),
        (lambda: lossfns.distill_loss(s, t, ignore_index=2**70), "ignore_index must fit in a 64-bit integer"),
        (lambda: lossfns.cross_entropy_loss(s, torch.zeros(4, dtype=torch.long), vocab_size=2**63),
         "vocab_size must fit in a 64-bit"),
        (lambda: lossfns.distill_loss(s, t, temperature=torch.tensor(2.0, requires_grad=True)),
         r"temperature is a tensor that requires grad, but the op takes a number and gives it no gradient"),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, th, tw, kd_weight=torch.ones((), requires_grad=True)),
         r"kd_weight is a tensor that requires grad"),
        # An input left on meta (weights never loaded) picked the fakes for the whole call, whose
        # empty outputs were taken for the loss and the gradients.
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, th, torch.empty(tw.shape, device="meta")),
         r"teacher_lm_head must be on student_hidden's device cpu; got meta"),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw.to("meta"), th, tw),
         r"student_lm_head must be on student_hidden's device cpu; got meta"),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, th.double(), tw),
         r"teacher_hidden must have student_hidden's dtype Float; got Double"),
        # True is an int to the schema: vocab_size=True made every loss 0.
        (lambda: lossfns.distill_loss(s, t, vocab_size=True), r"vocab_size must be an int, not a bool"),
        (lambda: lossfns.distill_loss(s, t, divergence="jsd", beta=True), r"beta must be a number, not a bool"),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, th, tw, chunk_size=True),
         r"chunk_size must be an int, not a bool"),
        # The same as 0-dim tensors (the schema takes those as numbers too), and a float tensor
        # for an int (the schema truncated it: vocab_size 5.7 counted 5 columns).
        (lambda: lossfns.distill_loss(s, t, vocab_size=torch.tensor(True)), r"vocab_size must be an int, not a bool"),
        (lambda: lossfns.distill_loss(s, t, temperature=torch.tensor(True)),
         r"temperature must be a number, not a bool"),
        (lambda: lossfns.distill_loss(s, t, vocab_size=torch.tensor(5.7)),
         r"vocab_size must be an int; got tensor\(5.7000\) \(torch.float32\)"),
        (lambda: lossfns.cross_entropy_loss(s, torch.zeros(4, dtype=torch.long), ignore_index=torch.tensor(1.9)),
         r"ignore_index must be an int; got tensor\(1.9000\) \(torch.float32\)"),
        # Another type where an int or a name is meant: the argument named (pybind's "Unable to
        # cast Python instance of type <class 'NoneType'> to C++ type '?'" named none).
        (lambda: lossfns.distill_loss(s, t, reduction=None), r"reduction must be a str; got None \(NoneType\)"),
        (lambda: lossfns.distill_loss(s, t, divergence=1), r"divergence must be a str; got 1 \(int\)"),
        (lambda: lossfns.tvd_loss(p, q, reduction=b"sum"), r"reduction must be a str; got b'sum' \(bytes\)"),
        (lambda: lossfns.distill_loss(s, t, ignore_index=1.5), r"ignore_index must be an int; got 1.5 \(float\)"),
        (lambda: lossfns.cross_entropy_loss(s, torch.zeros(4, dtype=torch.long), ignore_index=None),
         r"ignore_index must be an int; got None"),
        (lambda: lossfns.distill_loss(s, t, temperature=None), r"temperature must be a number; got None"),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, th, tw, chunk_size=64.0),
         r"chunk_size must be an int; got 64.0 \(float\)"),
        # grad_scale is a hint of grad_output's value: it gets no gradient.
        (lambda: lossfns.distill_loss(s, t, grad_scale=torch.ones((), requires_grad=True)),
         r"grad_scale must not require grad"),
        # Sparse and nested inputs: the op's words, not the dispatcher's about an internal op.
        (lambda: lossfns.distill_loss(s.detach().to_sparse(), t),
         r"student_logits and teacher_logits must be dense \(strided\) tensors; got a Sparse tensor"),
        (lambda: lossfns.tvd_loss(p, q.to_sparse()), r"p and q must be dense \(strided\) tensors"),
        (lambda: lossfns.cross_entropy_loss(s.detach().to_sparse(), torch.zeros(4, dtype=torch.long)),
         r"logits and labels must be dense \(strided\) tensors"),
        (lambda: lossfns.fused_linear_distill_loss(sh.to_sparse(), sw, th, tw),
         r"the hidden states and lm_heads must be dense \(strided\) tensors"),
        (lambda: lossfns.distill_loss(jagged, jagged), r"must be dense \(strided\) tensors; got a nested tensor"),
        (lambda: lossfns.distill_loss(s, t, torch.zeros(4, dtype=torch.long).to_sparse()),
         r"labels must be a dense \(strided\) tensor; got a Sparse tensor"),
        (lambda: lossfns.tvd_loss(p, q, torch.zeros(4, dtype=torch.long).to_sparse()),
         r"labels must be a dense \(strided\) tensor"),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, th, tw, torch.zeros(4, dtype=torch.long).to_sparse()),
         r"labels must be a dense \(strided\) tensor"),
        (lambda: lossfns.distill_loss(s, t, grad_scale=torch.ones(1).to_sparse()),
         r"grad_scale must be a dense \(strided\) tensor"),
        # Quantized tensors are strided too: they reached an internal op without a kernel.
        (lambda: lossfns.distill_loss(qint8(s), t),
         r"student_logits and teacher_logits must not be quantized; got a quantized QInt8 tensor "
         r"\(convert it: .dequantize\(\)\)"),
        (lambda: lossfns.distill_loss(s, qint8(t)), r"got a quantized QInt8 tensor"),
        (lambda: lossfns.tvd_loss(qint8(p), q), r"p and q must not be quantized"),
        (lambda: lossfns.cross_entropy_loss(qint8(s), torch.zeros(4, dtype=torch.long)),
         r"logits and labels must not be quantized"),
        (lambda: lossfns.fused_linear_distill_loss(sh, sw, th, qint8(tw)),
         r"the hidden states and lm_heads must not be quantized"),
    ]
    try:
        import numpy as np
    except ImportError:  # NumPy is optional for torch
        np = None
    if np is not None:  # NumPy's bool too: the schema took numpy.True_ as 1 as well (every loss 0)
        cases += [
            (lambda: lossfns.distill_loss(s, t, vocab_size=np.True_), r"vocab_size must be an int, not a bool"),
            (lambda: lossfns.distill_loss(s, t, temperature=np.False_), r"temperature must be a number, not a bool"),
        ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
    # Under inference mode the public ops go to their fakes for a meta input directly (no autograd
    # kernel first): the fakes make the same checks.
    with torch.inference_mode():
        for call, message in [
                (lambda: lossfns.fused_linear_distill_loss(sh, sw.to("meta"), th, tw),
                 r"student_lm_head must be on student_hidden's device cpu; got meta"),
                (lambda: lossfns.fused_linear_distill_loss(sh, sw, th.to("meta"), tw),
                 r"teacher_hidden must be on student_hidden's device cpu; got meta"),
                (lambda: lossfns.fused_linear_distill_loss(sh, sw, th, tw.to("meta")),
                 r"teacher_lm_head must be on student_hidden's device cpu; got meta"),
                (lambda: lossfns.distill_loss(s.detach(), t, grad_scale=torch.ones(1, device="meta")),
                 r"grad_scale must be a 1-element floating-point tensor on the logits' device cpu"),
                (lambda: lossfns.distill_loss(s.detach(), t.to("meta")),
                 r"teacher_logits must be on the student's device cpu; got meta")]:
            with pytest.raises(RuntimeError, match=message):
                call()
    with torch.no_grad():  # no gradient to lose: the number is taken
        lossfns.distill_loss(s, t, temperature=torch.nn.Parameter(torch.tensor(2.0)))
    # Under torch.compile too (the fakes check the labels as the kernels do).
    with pytest.raises(Exception, match=on_meta.format("student_logits")):
        torch.compile(lambda a, b, lab: lossfns.distill_loss(a, b, lab), fullgraph=True)(s, t, meta)


def test_numpy_numbers_are_checked_as_tensors_are():
    """NumPy's scalars and 0-dim arrays, which the schema takes as numbers: a bool is refused for
    a number, a float for an int (vocab_size=np.float32(5.7) counted 5 columns, np.array(True)
    1); NumPy ints and floats where those are meant pass."""
    np = pytest.importorskip("numpy")
    s, t = torch.randn(4, 10), torch.randn(4, 10)
    for kwargs, message in [({"vocab_size": np.array(True)}, "vocab_size must be an int, not a bool"),
                            ({"temperature": np.bool_(True)}, "temperature must be a number, not a bool"),
                            ({"vocab_size": np.float32(5.7)}, r"vocab_size must be an int; got .*5.7.* \(float32\)"),
                            ({"ignore_index": np.array(-100.5)}, r"ignore_index must be an int; got .* \(float64\)")]:
        with pytest.raises(RuntimeError, match=message):
            lossfns.distill_loss(s, t, **kwargs)
    torch.testing.assert_close(lossfns.distill_loss(s, t, vocab_size=np.int64(8), temperature=np.float32(2.0)),
                               lossfns.distill_loss(s, t, vocab_size=8, temperature=2.0))


def test_internal_ops_with_one_argument_on_meta_are_errors():
    """An internal op whose grad_output, stats or scale is on meta and the rest on the CPU runs
    the fake kernel in eager mode (the dispatcher picks Meta), which handed back uninitialised
    CPU memory as the gradient: an error naming the argument instead."""
    ops = torch.ops.lossfns
    s, t = torch.randn(4, 5), torch.randn(4, 5)
    lab = torch.tensor([0, 1, -100, 2])
    _, stats, scale, _ = ops._distill_forward(s, t, lab, 0, 0.5, 1.0, -100, 3, 5, None, True)
    _, ce_stats, ce_scale = ops._cross_entropy_forward(s, lab, -100, 3, 5)
    p, q = s.softmax(-1), t.softmax(-1)
    _, signs, tvd_scale = ops._tvd_forward(p, q, lab, -100, 3, True)
    meta = lambda x: x.to("meta")  # noqa: E731
    seven = torch.tensor(7.0)
    cases = [
        (lambda: ops._distill_backward(meta(seven), s, t, lab, stats, scale, 0, 0.5, 1.0, -100, 3, 5),
         r"_distill_backward: grad_output must be on the device of student_logits, cpu; got meta"),
        (lambda: ops._distill_backward(seven, s, t, lab, meta(stats), scale, 0, 0.5, 1.0, -100, 3, 5),
         r"_distill_backward: stats must be on the device of student_logits, cpu; got meta"),
        (lambda: ops._cross_entropy_backward(meta(seven), s, lab, ce_stats, ce_scale, -100, 3, 5),
         r"_cross_entropy_backward: grad_output must be on the device of logits, cpu; got meta"),
        (lambda: ops._tvd_backward(meta(seven), signs, tvd_scale, p, q, lab, -100, 5, torch.float32, 3),
         r"_tvd_backward: grad_output must be on the device of signs, cpu; got meta"),
        (lambda: ops._scale_cast(torch.ones(3, 3), meta(torch.tensor([2.0])), torch.bfloat16),
         r"_scale_cast: scale must be on the device of src, cpu; got meta"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
    # The same calls on one device still run.
    g = ops._distill_backward(seven, s, t, lab, stats, scale, 0, 0.5, 1.0, -100, 3, 5)
    assert g.device.type == "cpu" and torch.isfinite(g).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_internal_ops_with_one_argument_off_the_gpu_are_errors():
    """The CUDA kernels of the internal ops run when any argument is on the GPU (the dispatcher
    picks CUDA): a grad_output, scale or grad_scale left on the CPU would be read through a host
    pointer on the device (an illegal address, the CUDA context lost). An error naming the
    argument instead, as for meta above."""
    ops = torch.ops.lossfns
    s, t = torch.randn(4, 5, device="cuda"), torch.randn(4, 5, device="cuda")
    lab = torch.tensor([0, 1, -100, 2], device="cuda")
    _, stats, scale, _ = ops._distill_forward(s, t, lab, 0, 0.5, 1.0, -100, 3, 5, None, True)
    _, ce_stats, ce_scale = ops._cross_entropy_forward(s, lab, -100, 3, 5)
    p, q = s.softmax(-1), t.softmax(-1)
    _, signs, tvd_scale = ops._tvd_forward(p, q, lab, -100, 3, True)
    seven, cpu = torch.tensor(7.0, device="cuda"), (lambda x: x.cpu())  # noqa: E731
    dev = str(s.device)
    grad = torch.zeros(4, 5, device="cuda")
    cases = [
        (lambda: ops._distill_backward(cpu(seven), s, t, lab, stats, scale, 0, 0.5, 1.0, -100, 3, 5),
         rf"_distill_backward: grad_output must be on the device of student_logits, {dev}; got cpu"),
        (lambda: ops._distill_backward(seven, s, t, lab, stats, cpu(scale), 0, 0.5, 1.0, -100, 3, 5),
         rf"_distill_backward: scale must be on the device of student_logits, {dev}; got cpu"),
        (lambda: ops._distill_rescale_grad_(grad, cpu(seven), seven),
         rf"_distill_rescale_grad_: grad_output must be on the device of grad, {dev}; got cpu"),
        (lambda: ops._distill_rescale_grad_(grad, seven, cpu(seven)),
         rf"_distill_rescale_grad_: grad_scale must be on the device of grad, {dev}; got cpu"),
        (lambda: ops._cross_entropy_backward(cpu(seven), s, lab, ce_stats, ce_scale, -100, 3, 5),
         rf"_cross_entropy_backward: grad_output must be on the device of logits, {dev}; got cpu"),
        (lambda: ops._cross_entropy_backward(seven, s, lab, ce_stats, cpu(ce_scale), -100, 3, 5),
         rf"_cross_entropy_backward: scale must be on the device of logits, {dev}; got cpu"),
        (lambda: ops._tvd_backward(cpu(seven), signs, tvd_scale, p, q, lab, -100, 5, torch.float32, 3),
         rf"_tvd_backward: grad_output must be on the device of signs, {dev}; got cpu"),
        (lambda: ops._tvd_backward(seven, signs, cpu(tvd_scale), p, q, lab, -100, 5, torch.float32, 3),
         rf"_tvd_backward: scale must be on the device of signs, {dev}; got cpu"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
    # The same calls on one device still run, and the context is intact.
    g = ops._distill_backward(seven, s, t, lab, stats, scale, 0, 0.5, 1.0, -100, 3, 5)
    ops._distill_rescale_grad_(g, seven, seven)
    assert g.device == s.device and torch.isfinite(g).all().item()


def test_module_arguments_are_checked_when_built():
    """beta=None is refused for every divergence (the op's schema takes a float: it failed at the
    first call with the schema's words), and an int too large for a float is a ValueError like
    the other bad values, not Python's OverflowError."""
    with pytest.raises(ValueError, match=r"beta must be a Python number .*got None"):
        lossfns.DistillLoss(divergence="tvd", beta=None)
    with pytest.raises(ValueError, match=r"temperature must be > 0 and representable"):
        lossfns.DistillLoss(temperature=10**400)
    with pytest.raises(ValueError, match=r"beta must be a finite number"):
        lossfns.DistillLoss(divergence="jsd", beta=10**400)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\] for 'jsd'"):
        lossfns.DistillLoss(divergence="jsd", beta=2)
    with pytest.raises(ValueError, match=r"beta must be a finite number"):
        lossfns.DistillLoss(divergence="tvd", beta=10**400)
    assert lossfns.DistillLoss(divergence="tvd", beta=2.0).beta == 2.0  # unread by tvd: its value is free


def test_modules_and_the_op_agree_on_the_temperatures_at_float32s_limits():
    """The module's check at construction is the op's: the same temperatures refused and accepted
    around float32's largest value and the smallest whose inverse is finite."""
    big = torch.finfo(torch.float32).max
    cases = [big, big * (1 + 2.0 ** -25), big * (1 + 2.0 ** -23), 1 / big, 2.95e-39, 2.9e-39, 1e-45, 5e-324,
             3.4e38, 1e38, 1e-38]
    s = torch.randn(2, 5)
    for t in cases:
        try:
            lossfns.distill_loss(s, s, temperature=t)
            op_ok = True
        except RuntimeError as e:
            assert "temperature must be > 0" in str(e), e
            op_ok = False
        try:
            lossfns.DistillLoss(temperature=t)
            module_ok = True
        except ValueError as e:
            assert "temperature must be > 0" in str(e), e
            module_ok = False
        assert module_ok == op_ok, (t, module_ok, op_ok)
    lossfns.DistillLoss(temperature=big)  # float32's largest value is a temperature


def second_order_cases():
    s0, t = torch.randn(4, 10, dtype=torch.float64), torch.randn(4, 10, dtype=torch.float64)
    labels = torch.randint(0, 10, (4,))
    sw, th, tw = (torch.randn(12, 10, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64),
                  torch.randn(12, 6, dtype=torch.float64))
    return [("lossfns.distill_loss", lambda s: lossfns.distill_loss(s, t, divergence="forward_kl")),
            ("lossfns.tvd_loss", lambda s: lossfns.tvd_loss(torch.softmax(s, -1), torch.softmax(t, -1))),
            ("lossfns.cross_entropy_loss", lambda s: lossfns.cross_entropy_loss(s, labels)),
            ("lossfns.fused_linear_distill_loss",
             lambda s: lossfns.fused_linear_distill_loss(s, sw, th, tw, labels, ce_weight=0.5))], s0


def test_second_order_gradients_raise_through_autograd_grad():
    """A gradient penalty differentiated with respect to the input raises (it came back as zeros)."""
    cases, s0 = second_order_cases()
    for name, op in cases:
        s = s0.clone().requires_grad_()
        g, = torch.autograd.grad(op(s), s, create_graph=True)
        with pytest.raises(RuntimeError, match=f"{name}: its gradient cannot be differentiated again"):
            torch.autograd.grad((g ** 2).sum(), s)
        g, = torch.autograd.grad(op(s), s, create_graph=True)
        with pytest.raises(RuntimeError, match=f"{name}: its gradient cannot be differentiated again"):
            (g ** 2).sum().backward(inputs=[s])


def test_compiled_autograd_runs_the_backward():
    """torch._dynamo's compiled autograd hashes what each node saved: the ops keep only tensors and
    plain values there."""
    cases, s0 = second_order_cases()
    for name, op in cases:
        s = s0.clone().requires_grad_()
        expected, = torch.autograd.grad(op(s), s)
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend="eager")):
            op(s).backward()
        torch.testing.assert_close(s.grad, expected, rtol=0, atol=0, msg=name)


def test_torch_export_traces_every_op():
    """torch.export takes each module wrapper (and the fused op inside a user's module) to the
    registered op, and the exported program gives eager's loss and gradients bit for bit."""
    p, q, lab = inputs((7, 300), torch.float32, "cpu")
    ce_lab = torch.where(lab >= 0, lab % 290, lab)  # labels below CrossEntropyLoss's vocab_size
    g = torch.Generator().manual_seed(3)
    s, t = torch.randn(7, 300, generator=g), torch.randn(7, 280, generator=g)
    sh, sw, th, tw, hlab = hidden_states((2, 3), torch.float32, "cpu")

    class Fused(torch.nn.Module):
        def forward(self, sh, sw, th, tw, lab):
            return lossfns.fused_linear_distill_loss(sh, sw, th, tw, lab, "jsd", ce_weight=0.5)

    # (module, inputs, the indices of those that get a gradient, the op)
    cases = [(lossfns.TVDLoss(reduction="sum"), (p, q, lab), (0, 1), torch.ops.lossfns.tvd_loss.default),
             (lossfns.DistillLoss(divergence="jsd", beta=0.3, temperature=2.0), (s, t, lab), (0,),
              torch.ops.lossfns.distill_loss.default),
             (lossfns.CrossEntropyLoss(vocab_size=290), (s, ce_lab), (0,), torch.ops.lossfns.cross_entropy_loss.default),
             (Fused(), (sh, sw, th, tw, hlab), (0, 1), torch.ops.lossfns.fused_linear_distill_loss.default)]
    for module, args, learned, op in cases:
        program = torch.export.export(module, args)
        assert [n.target for n in program.graph.nodes if isinstance(n.target, torch._ops.OpOverload)] == [op]
        x = [a.clone().requires_grad_() if i in learned else a for i, a in enumerate(args)]
        y = [a.clone().requires_grad_() if i in learned else a for i, a in enumerate(args)]
        expected, got = module(*x), program.module()(*y)
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=type(module).__name__)
        got.backward()
        expected.backward()
        for a, b in zip(x, y):
            if a.requires_grad:
                torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0, msg=type(module).__name__)


# Each op on inputs of three sizes: every dimension a symbol under dynamic shapes (the row count,
# B and T, the vocabulary; the fused op's lm_head too). (shape of the logits or hidden states, V)
# per call, sizes above 1 (torch.compile specialises 0 and 1).
SIZES_2D = [((5,), 33), ((7,), 40), ((11,), 29)]
SIZES_3D = [((2, 5), 33), ((3, 7), 40), ((2, 11), 29)]


def dynamic_case(op, lead, V, reduction, device="cpu"):
    """(fn, leaves) for one call of `op` on inputs of leading shape `lead` and width V."""
    g = torch.Generator().manual_seed(len(lead) * 100 + V)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    lab = torch.randint(0, 26, lead, generator=g)  # below vocab_size 26: a constant (closures are guarded)
    lab.view(-1)[::3] = -100
    lab = lab.to(device)
    if op == "tvd":
        p, q = randn(*lead, V).softmax(-1), randn(*lead, V).softmax(-1)
        return (lambda p, q: lossfns.tvd_loss(p, q, lab, -100, reduction)), (p, q)
    if op == "cross_entropy":
        return (lambda x: lossfns.cross_entropy_loss(x, lab, reduction=reduction, vocab_size=26)), (randn(*lead, V),)
    if op == "fused_linear":
        # Hidden sizes unlike any other size here (torch.compile takes equal sizes for one symbol).
        sh, th, sw, tw = randn(*lead, 12), randn(*lead, 10), randn(V, 12), randn(V - 1, 10)
        return (lambda sh, sw: lossfns.fused_linear_distill_loss(
            sh, sw, th, tw, lab, "jsd", reduction=reduction, ce_weight=0.5, chunk_size=4)), (sh, sw)
    s, t = randn(*lead, V), randn(*lead, V - 1)
    return (lambda s: lossfns.distill_loss(s, t, lab, op, temperature=2.0, reduction=reduction,
                                           vocab_size=26)), (s,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["2d", "3d"])
@pytest.mark.parametrize("reduction", ["none", "batchmean"])
@pytest.mark.parametrize("op", ["tvd", "cross_entropy", "fused_linear"] + list(DIVERGENCES))
def test_dynamic_shapes_compile_once_for_every_size(op, reduction, layout, device):
    """torch.compile(dynamic=True, fullgraph=True) compiles one graph for inputs of any size, as
    torch's own losses do: the ops' C++ autograd and composite kernels keep sizes symbolic (a
    size read as a number made it a constant of the graph: a recompile for every new batch or
    sequence length, and a hard error at the eighth under fullgraph). Forward and backward give
    eager's numbers at every size."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    for lead, V in SIZES_2D if layout == "2d" else SIZES_3D:
        fn, leaves = dynamic_case(op, lead, V, reduction, device)
        out = {}
        for name, f in [("eager", fn), ("aot", torch.compile(fn, backend=counter, fullgraph=True, dynamic=True))]:
            xs = [x.clone().requires_grad_() for x in leaves]
            loss = f(*xs)
            loss.backward(torch.ones_like(loss) * 0.5)
            out[name] = (loss.detach(), *(x.grad for x in xs))
        assert_aot_matches_eager(out)
    assert counter.frame_count == 1, f"{counter.frame_count} graphs compiled for 3 sizes"


def test_fused_linear_shape_errors_under_dynamic_shapes_name_the_shapes():
    """A wrong labels or teacher_hidden shape under symbolic sizes gets the op's message (its
    shapes printed as symbols), not torch's about calling sizes() on symbolic sizes."""
    torch._dynamo.reset()
    f = torch.compile(lambda sh, sw, th, tw, lab: lossfns.fused_linear_distill_loss(sh, sw, th, tw, lab),
                      backend="aot_eager", fullgraph=True, dynamic=True)
    for lead in ((2, 5), (3, 7)):  # the second call runs the compiled graph's guards
        sh, sw, th, tw, lab = hidden_states(lead, torch.float32, "cpu")
        f(sh, sw, th, tw, lab)
    sh, sw, th, tw, lab = hidden_states((2, 5), torch.float32, "cpu")
    with pytest.raises(Exception, match=r"labels must have shape \[.*\] \(the shape of student_hidden without"):
        f(sh, sw, th, tw, lab.reshape(-1)[:9])
    with pytest.raises(Exception, match=r"teacher_hidden must have the leading shape \["):
        f(sh, sw, th[:, :4], tw, lab)


def test_torch_export_with_a_dynamic_token_dimension():
    """torch.export with the token dimension declared dynamic (every input's first): the program
    runs at another token count with eager's numbers (the ops made it a constant: 'Constraints
    violated')."""
    def make(rows):
        g = torch.Generator().manual_seed(rows)
        lab = torch.randint(0, 30, (rows,), generator=g)
        lab[::3] = -100
        return {"tvd": (torch.randn(rows, 33, generator=g).softmax(-1),
                        torch.randn(rows, 33, generator=g).softmax(-1), lab),
                "cross_entropy": (torch.randn(rows, 33, generator=g), lab),
                "jsd": (torch.randn(rows, 33, generator=g), torch.randn(rows, 32, generator=g), lab),
                "fused_linear": (torch.randn(rows, 6, generator=g), torch.randn(rows, 5, generator=g), lab)}

    sw, tw = torch.randn(33, 6), torch.randn(32, 5)
    fns = {"tvd": lambda p, q, lab: lossfns.tvd_loss(p, q, lab),
           "cross_entropy": lambda x, lab: lossfns.cross_entropy_loss(x, lab, vocab_size=31),
           "jsd": lambda s, t, lab: lossfns.distill_loss(s, t, lab, "jsd", temperature=2.0),
           "fused_linear": lambda sh, th, lab: lossfns.fused_linear_distill_loss(sh, sw, th, tw, lab, ce_weight=0.5)}
    n = torch.export.Dim("n", min=2, max=4096)
    for op, fn in fns.items():
        class Wrap(torch.nn.Module):
            def forward(self, *xs):
                return fn(*xs)

        args = make(6)[op]
        program = torch.export.export(Wrap(), args, dynamic_shapes=[tuple({0: n} for _ in args)])
        other = make(9)[op]
        torch.testing.assert_close(program.module()(*other), fn(*other), rtol=0, atol=0, msg=op)


def test_scripted_code_calls_the_registered_ops():
    """TorchScript cannot compile the typed Python wrappers (their Literal names); scripted code
    calls torch.ops.lossfns.* with the schema's arguments instead (docs/api.md). torch.jit.script
    is deprecated (torch 2.11 warns), but it still runs."""
    def jsd(s: torch.Tensor, t: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.ops.lossfns.distill_loss(s, t, labels, "jsd", 0.3, 2.0, -100, "batchmean", None, None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        jsd = torch.jit.script(jsd)
        with pytest.raises(Exception, match="Divergence"):  # what docs/api.md says
            torch.jit.script(lossfns.DistillLoss())

    g = torch.Generator().manual_seed(4)
    s, t = torch.randn(6, 50, generator=g), torch.randn(6, 50, generator=g)
    labels = torch.tensor([1, -100, 3, 4, -100, 5])
    torch.testing.assert_close(jsd(s, t, labels), lossfns.distill_loss(s, t, labels, "jsd", 0.3, 2.0),
                               rtol=0, atol=0)


def test_forward_mode_ad_is_refused():
    """A tangent is refused with the op's own error (the forward-only path returned no tangent)."""
    import torch.autograd.forward_ad as fwad
    cases, s0 = second_order_cases()
    sh, sw, th, tw, lab = hidden_states((5,), torch.float64, "cpu")
    cases.append(("lossfns.fused_linear_distill_loss",
                  lambda h: lossfns.fused_linear_distill_loss(h, sw, th, tw, lab)))
    for name, op in cases:
        x = sh if "fused" in name else s0
        with pytest.raises(RuntimeError, match=f"{name}: forward-mode AD"):
            torch.func.jvp(op, (x,), (torch.randn_like(x),))
        with fwad.dual_level(), pytest.raises(RuntimeError, match=f"{name}: forward-mode AD"):
            op(fwad.make_dual(x, torch.randn_like(x)))


# --- lossfns.fused_linear_distill_loss ------------------------------------------------------------
def hidden_states(lead, dtype, device, labels="some", hs=12, ht=10, vs=300, vt=280):
    """Student and teacher hidden states and lm_heads (V_s 300 != V_t 280), labels with every 3rd
    row ignored (or all, or None)."""
    g = torch.Generator().manual_seed(0)
    rows = math.prod(lead)
    sh = torch.randn(*lead, hs, generator=g, dtype=torch.float64)
    sw = torch.randn(vs, hs, generator=g, dtype=torch.float64) * 0.6
    th = torch.randn(*lead, ht, generator=g, dtype=torch.float64)
    tw = torch.randn(vt, ht, generator=g, dtype=torch.float64) * 0.6
    lab = None
    if labels is not None:
        lab = torch.randint(0, 280, (rows,), generator=g)
        lab[:: 3 if labels == "some" else 1] = -100
        lab = lab.view(lead).to(device)
    return tuple(x.to(device, dtype) for x in (sh, sw, th, tw)) + (lab,)


def fused_composite(sh, sw, th, tw, lab, divergence, reduction, vocab_size, kd_weight, ce_weight):
    """The unfused composite a user would write: full logits, distill_loss, cross_entropy."""
    s, t = sh @ sw.T, th @ tw.T
    kd = lossfns.distill_loss(s, t, lab, divergence, 0.3, 1.5, -100, reduction, vocab_size)
    n = min(vocab_size or max(sw.shape[0], tw.shape[0]), sw.shape[0])
    ce = torch.nn.functional.cross_entropy(s[..., :n].reshape(-1, n), lab.reshape(-1), ignore_index=-100,
                                           reduction={"batchmean": "mean"}.get(reduction, reduction))
    return kd_weight * kd + ce_weight * ce.view(kd.shape)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_fused_linear_matches_the_composite(divergence, reduction):
    """float64, (B, T, H) inputs, V_s 300 != V_t 280 cut to vocab_size 280 (the student's last 20
    columns padding), chunks of 4 rows (not dividing 14): loss, terms and both gradients within
    float64 rounding of the composite."""
    sh, sw, th, tw, lab = hidden_states((2, 7), torch.float64, "cpu")
    go = torch.rand(2, 7, dtype=torch.float64) if reduction == "none" else torch.tensor(0.75, dtype=torch.float64)
    args = (divergence, reduction, 280, 0.8, 0.4)
    a, b = [(sh.clone().requires_grad_(), sw.clone().requires_grad_()) for _ in range(2)]
    out = lossfns.fused_linear_distill_loss(a[0], a[1], th, tw, lab, divergence, 0.3, 1.5, -100, reduction, 280,
                                            0.8, 0.4, chunk_size=4, return_parts=True)
    ref = fused_composite(b[0], b[1], th, tw, lab, *args)
    torch.testing.assert_close(out.loss, ref, rtol=1e-10, atol=1e-12)
    assert not out.divergence.requires_grad and not out.ce.requires_grad
    kd_only = fused_composite(sh, sw, th, tw, lab, divergence, reduction, 280, 1.0, 0.0)
    torch.testing.assert_close(out.divergence, kd_only, rtol=1e-10, atol=1e-12)
    out.loss.backward(go)
    ref.backward(go)
    for ours, theirs in zip(a, b):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_opcheck_fused_linear_ops(device, reduction):
    dtype = torch.float64 if device == "cpu" else torch.float32
    sh, sw, th, tw, lab = hidden_states((7,), dtype, device)
    op = torch.ops.lossfns.fused_linear_distill_loss.default
    args = (lab, "jsd", 0.3, 1.5, -100, reduction, 280, 0.8, 0.4, 3)
    torch.library.opcheck(op, (sh.clone().requires_grad_(), sw.clone().requires_grad_(), th, tw) + args)  # autograd
    torch.library.opcheck(op, (sh, sw, th, tw) + args)  # no grad: every check
    code, jsd = REDUCTIONS.index(reduction), DIVERGENCES.index("jsd")
    for grads in [(False, False), (True, True), (True, False)]:
        torch.library.opcheck(torch.ops.lossfns._fused_linear_distill_forward.default,
                              (sh, sw, th, tw, lab, jsd, 0.3, 1.5, -100, code, 280, 0.8, 0.4, 3) + grads)
    torch.library.opcheck(torch.ops.lossfns._fused_linear_distill_backward.default,
                          (torch.rand(7, dtype=dtype, device=device), sh, sw, th, tw, lab, jsd, 0.3, 1.5, -100, 280,
                           0.8, 0.4, 3, True, True))
    acc = torch.randn(280, 5, dtype=torch.float32, device=device)  # the backward's lm_head gradient scaling
    for out_dtype in (torch.bfloat16, torch.float32):
        torch.library.opcheck(torch.ops.lossfns._scale_cast.default,
                              (acc, torch.tensor(0.7, device=device), out_dtype))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("reduction", ["batchmean", "none"])
def test_fused_linear_aot_matches_eager(reduction, dynamic):
    sh, sw, th, tw, lab = hidden_states((2, 5), torch.float32, "cpu")
    fn = lambda sh, sw: lossfns.fused_linear_distill_loss(  # noqa: E731
        sh, sw, th, tw, lab, "forward_kl", temperature=2.0, reduction=reduction, ce_weight=0.5, chunk_size=3)
    assert_aot_matches_eager(eager_and_aot(fn, (sh, sw), dynamic))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["batchmean", "none"])
def test_fused_linear_under_autocast_casts_like_a_linear_layer(reduction, device):
    """Under torch.autocast the op takes autocast's matmul policy, as a linear layer does: float32
    inputs are cast to the region's dtype (the loss and the gradients then exactly those of the
    op on the cast inputs, outside autocast), and the float32 leaves get float32 gradients
    through the cast. (It failed: the internal matmuls were recast, the gradient buffers not.)"""
    sh, sw, th, tw, lab = hidden_states((2, 5), torch.float32, device)
    low = torch.bfloat16 if device == "cpu" else torch.float16

    def run(cast, autocast):
        x, w = sh.clone().requires_grad_(), sw.clone().requires_grad_()
        args = [a.to(low) if cast else a for a in (x, w, th, tw)]
        with torch.autocast(device, dtype=low, enabled=autocast):
            loss = lossfns.fused_linear_distill_loss(*args, lab, "jsd", reduction=reduction,
                                                     ce_weight=0.5, chunk_size=4)
        loss.backward(torch.ones_like(loss) * 0.5)
        return loss.detach(), x.grad, w.grad

    got, want = run(cast=False, autocast=True), run(cast=True, autocast=False)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.float32
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # A forward outside autocast whose backward runs inside a region ('none' recomputes every chunk
    # in backward): the float32 op throughout, as without autocast.
    x = sh.clone().requires_grad_()
    loss = lossfns.fused_linear_distill_loss(x, sw, th, tw, lab, reduction=reduction, chunk_size=4)
    with torch.autocast(device, dtype=low):
        loss.backward(torch.ones_like(loss))
    y = sh.clone().requires_grad_()
    lossfns.fused_linear_distill_loss(y, sw, th, tw, lab, reduction=reduction, chunk_size=4).backward(
        torch.ones_like(loss))
    torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
    with torch.no_grad(), torch.autocast(device, dtype=low):
        torch.testing.assert_close(lossfns.fused_linear_distill_loss(sh, sw, th, tw, lab, reduction=reduction),
                                   lossfns.fused_linear_distill_loss(sh.to(low), sw.to(low), th.to(low), tw.to(low),
                                                                     lab, reduction=reduction), rtol=0, atol=0)
    # float64 beside float32: autocast leaves the float64 one, and the op's error names the dtypes
    # passed, not the region's (it said "student_hidden's dtype Double; got BFloat16").
    with torch.autocast(device, dtype=low), pytest.raises(
            RuntimeError, match=r"teacher_hidden must have student_hidden's dtype Double; got Float \(convert"):
        lossfns.fused_linear_distill_loss(sh.double(), sw.double(), th, tw, lab, reduction=reduction)


ALLOCATOR_C = r"""
#include <stddef.h>
#include <sys/types.h>
typedef struct CUstream_st* cudaStream_t;
int cudaMalloc(void** p, size_t n);
int cudaFree(void* p);
void* lossfns_test_malloc(ssize_t size, int device, cudaStream_t stream) {
  void* p = 0;
  return cudaMalloc(&p, (size_t)size) == 0 ? p : 0;
}
void lossfns_test_free(void* p, ssize_t size, int device, cudaStream_t stream) { cudaFree(p); }
"""

ALLOCATOR_RUN = r"""
import sys, torch
torch.cuda.memory.change_current_allocator(
    torch.cuda.memory.CUDAPluggableAllocator(sys.argv[1], "lossfns_test_malloc", "lossfns_test_free"))
import lossfns
g = torch.Generator(device="cuda").manual_seed(0)
sh = torch.randn(300, 32, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
sw = torch.randn(1000, 32, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
th = torch.randn(300, 48, device="cuda", generator=g, dtype=torch.bfloat16)
tw = torch.randn(1000, 48, device="cuda", generator=g, dtype=torch.bfloat16)
lab = torch.randint(0, 1000, (300,), device="cuda", generator=g)
loss = lossfns.fused_linear_distill_loss(sh, sw, th, tw, lab, "forward_kl", ce_weight=0.5)
loss.backward()
ref = lossfns.fused_linear_distill_loss(sh, sw, th, tw, lab, "forward_kl", ce_weight=0.5, chunk_size=300)
assert torch.isfinite(sh.grad).all() and torch.isfinite(sw.grad).all(), "non-finite gradient"
torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)
print("OK", float(loss))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_fused_linear_under_an_applications_own_cuda_allocator(tmp_path):
    """With torch.cuda.memory.change_current_allocator (RMM and the like), c10's native allocator
    is never initialised and a pluggable one keeps no statistics: the automatic chunk size asked
    them and the op failed with an error about neither. It runs, sizing chunks from free memory.
    (A subprocess: the allocator must be chosen before CUDA's first allocation.)"""
    src, lib = tmp_path / "alloc.c", tmp_path / "alloc.so"
    src.write_text(ALLOCATOR_C)
    major = torch.version.cuda.split(".")[0]  # the runtime torch itself loaded, not the toolkit's
    cudart = [d for d in (os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", f"cu{major}", "lib"),
                          os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cuda_runtime", "lib"),
                          "/usr/local/cuda/lib64", "/usr/local/cuda/lib") if os.path.isdir(d)]
    cc = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)] +
                        [f"-L{d}" for d in cudart] + [f"-l:libcudart.so.{major}"], capture_output=True, text=True)
    if cc.returncode != 0:
        pytest.skip(f"cannot build the test allocator: {cc.stderr.strip()[:200]}")
    r = subprocess.run([sys.executable, "-c", ALLOCATOR_RUN, str(lib)], capture_output=True, text=True,
                       env=dict(os.environ), timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr


def test_fused_linear_errors_and_teacher_constant():
    sh, sw, th, tw, lab = hidden_states((7,), torch.float32, "cpu")
    with pytest.raises(RuntimeError, match=r"teacher_lm_head must not require grad .*pass teacher_lm_head.detach\(\)$"):
        lossfns.fused_linear_distill_loss(sh.requires_grad_(), sw, th, tw.clone().requires_grad_(), lab)
    with pytest.raises(RuntimeError, match="teacher_hidden and teacher_lm_head must not require grad"):
        lossfns.fused_linear_distill_loss(sh, sw, th.clone().requires_grad_(), tw.clone().requires_grad_(), lab)
    with pytest.raises(RuntimeError, match="ce_weight 0.5 needs labels"):
        lossfns.fused_linear_distill_loss(sh, sw, th, tw, None, ce_weight=0.5)
    with pytest.raises(RuntimeError, match=r"student_lm_head must be \(V_s, H_s\) with H_s = 12"):
        lossfns.fused_linear_distill_loss(sh, sw[:, :5], th, tw, lab)
    with pytest.raises(RuntimeError, match="divergence must be one of"):
        lossfns.fused_linear_distill_loss(sh, sw, th, tw, lab, divergence="kl")
    loss = lossfns.fused_linear_distill_loss(sh, sw, th, tw, lab)
    assert loss.shape == () and loss.dtype == torch.float32 and loss.requires_grad
