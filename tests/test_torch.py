"""PyTorch in directly. ``torch.compile(model, backend="tvm_taso")``: eager's outputs, the
search's rewrites in the compiled graph, and eager PyTorch (with one warning naming the reason)
for a graph the backend cannot take. ``tvm-taso optimize/compile model.pt2``: a saved
``torch.export`` program optimized, checked against eager, written; bad files one line."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tvm_taso.cli.main import main as cli  # noqa: E402
from tvm_taso.driver import TasoSkippedWarning  # noqa: E402
from tvm_taso.numerics import relative_error  # noqa: E402
from tvm_taso.passes import TasoBackend  # noqa: E402

OPTIONS = {"time_limit": 20, "cost_model": "analytic"}


class ConvNet(torch.nn.Module):
    """Conv, batch norm and ReLU, then two parallel 1x1 convs of the same input (a merge) and a
    linear head."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.left, self.right = torch.nn.Conv2d(8, 8, 1), torch.nn.Conv2d(8, 8, 1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.stem(x)))
        h = torch.relu(self.left(h)) + torch.relu(self.right(h))
        return self.head(h.mean(dim=(2, 3)))


class Attention(torch.nn.Module):
    """Q, K and V projections of one input and a softmax attention."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 8.0
        return torch.softmax(scores, dim=-1) @ self.v(x)


class Chain(torch.nn.Module):
    """Linear layers in a row: their weights multiply into one (a rewrite that pays on a CPU)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, width, bias=False), torch.nn.Linear(width, width, bias=False)
        self.c = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.c(self.b(self.a(x))) * 0.5)


def _model(cls):
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():  # batch norm statistics that are not the identity
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_backend_is_registered_under_its_name():
    assert "tvm_taso" in torch._dynamo.list_backends()


@pytest.mark.parametrize("cls, shape", [(ConvNet, (2, 3, 16, 16)), (Attention, (2, 16, 32)), (Chain, (4, 32))])
def test_compiled_models_match_eager(cls, shape):
    model = _model(cls)
    x = torch.randn(*shape)
    backend = TasoBackend(**OPTIONS)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TasoSkippedWarning)  # no graph left to eager
        got, want = compiled(x), model(x)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
    assert relative_error([want.numpy()], [got.numpy()]) <= 1e-4
    assert backend.fallbacks == [] and len(backend.reports) == 1
    report = backend.reports[0]
    assert report["cost_after"] <= report["cost_before"]
    if cls is Chain:  # the compiled graph is the rewritten one
        assert report["applied"].get("matmul-assoc-right"), report["applied"]


def test_options_reach_the_backend_by_name():
    model = _model(Attention)
    x = torch.randn(1, 8, 32)
    compiled = torch.compile(model, backend="tvm_taso", options=OPTIONS)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TasoSkippedWarning)
        assert relative_error([model(x).numpy()], [compiled(x).numpy()]) <= 1e-4


def test_a_graph_with_an_op_the_frontend_lacks_runs_in_eager_with_one_warning():
    class Zeta(torch.nn.Module):
        def forward(self, x):
            return torch.special.zeta(x, torch.full_like(x, 2.0)) + 1.0

    x = torch.rand(4, 4) + 1.5
    backend = TasoBackend(**OPTIONS)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = torch.compile(Zeta(), backend=backend)(x)
    np.testing.assert_array_equal(got.numpy(), Zeta()(x).numpy())
    ours = [w for w in said if issubclass(w.category, TasoSkippedWarning)]
    assert len(ours) == 1 and "eager PyTorch" in str(ours[0].message) and "zeta" in str(ours[0].message)
    assert len(backend.fallbacks) == 1


def test_inputs_that_need_gradients_run_in_eager():
    model = _model(Attention)
    x = torch.randn(1, 8, 32, requires_grad=True)
    backend = TasoBackend(**OPTIONS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TasoSkippedWarning)
        got = torch.compile(model, backend=backend)(x)
    got.sum().backward()  # eager's graph: gradients flow
    assert x.grad is not None and "requires grad" in backend.fallbacks[0]


def test_graph_breaks_compile_each_graph():
    class TwoGraphs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            h = torch.relu(self.a(x))
            torch._dynamo.graph_break()
            return self.b(h) * 2.0

    model = _model(TwoGraphs)
    x = torch.randn(4, 16)
    backend = TasoBackend(**OPTIONS)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
        want = model(x)
    assert len(backend.reports) == 2 and backend.fallbacks == []
    assert relative_error([want.numpy()], [got.numpy()]) <= 1e-4


@pytest.fixture
def chain_program(tmp_path):
    path = tmp_path / "chain.pt2"
    torch.export.save(torch.export.export(_model(Chain), (torch.randn(4, 32),)), str(path))
    return path


def test_optimize_a_saved_program_checks_it_against_eager_and_writes_relax(chain_program, tmp_path, capsys):
    import tvm

    out, report = tmp_path / "chain.json", tmp_path / "report.json"
    assert cli(["optimize", str(chain_program), "-o", str(out), "--target", "llvm", "--cost", "analytic",
                "--check", "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "matmul-assoc-right" in printed and "via PyTorch eager" in printed
    result = json.loads(report.read_text())
    assert result["applied"].get("matmul-assoc-right") and result["check"]["ok"]
    assert result["check"]["max_relative_error"] <= 1e-4
    mod = tvm.ir.load_json(out.read_text())
    assert "main" in [g.name_hint for g in mod.functions]


def test_compile_a_saved_program(chain_program, tmp_path):
    out = tmp_path / "chain.so"
    assert cli(["compile", str(chain_program), "-o", str(out), "--target", "llvm"]) == 0
    assert out.stat().st_size > 0


@pytest.mark.parametrize("content", [b"", b"not a zip archive", None])
def test_a_bad_program_file_is_one_line_and_exit_2(tmp_path, capsys, content):
    path = tmp_path / "bad.pt2"
    if content is not None:
        path.write_bytes(content)
    assert cli(["optimize", str(path), "-o", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0], err
    assert not (tmp_path / "out.json").exists()


def test_a_bad_backend_option_is_one_line_at_construction():
    with pytest.raises(TypeError, match="unknown option.*budgett"):
        TasoBackend(budgett=10)
    with pytest.raises(ValueError, match="alpha must be"):
        TasoBackend(alpha=0.5)
    with pytest.raises(ValueError, match="unknown target"):
        TasoBackend(target="no-such-target")
