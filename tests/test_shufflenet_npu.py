"""models/shufflenet_npu.py: equal to torchvision's ShuffleNetV2 (weights, outputs, gradients,
BatchNorm statistics), custom autograd Functions, index buffers, export paths, registry."""
import inspect
import os
import sys
import types

import pytest
import torch
import torchvision
from torchvision.models.shufflenetv2 import channel_shuffle as tv_channel_shuffle

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import models  # noqa: E402
from conftest import ONCE, STACK
from models import shufflenet_npu as snpu  # noqa: E402

pytestmark = STACK

WIDTHS = ["x0_5", "x1_0", "x1_5", "x2_0"]
NUM_CLASSES = 10
INDEX_BUFFERS = ("shuffle_index", "shuffle_index1", "shuffle_index2",
                 "unshuffle_index1", "unshuffle_index2")
CUSTOM_NODES = {"_ConcatShuffleBackward", "_ConcatShuffleSplitBackward"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny float64 models: one intra-op thread is fastest, and it avoids OpenMP barrier stalls
    # (observed: 100x slowdowns) when other processes share the 2 cores. Restored afterwards.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_pair(width, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    tv = torchvision.models.__dict__["shufflenet_v2_" + width](num_classes=NUM_CLASSES).to(dtype)
    ours = models.get_model("shufflenet_v2_{}_npu".format(width), num_classes=NUM_CLASSES).to(dtype)
    ours.load_state_dict(tv.state_dict(), strict=True)
    return tv, ours


def calibrate_bn(model, size=32, batches=3):
    """Cumulative BatchNorm statistics from a few random batches, so that eval-mode outputs are
    O(1) (fresh running stats shrink them to ~1e-2 and would make absolute tolerances weak)."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(4, 3, size, size, dtype=next(model.parameters()).dtype))
    for bn, mom in zip(bns, saved):
        bn.momentum = mom
    return model.eval()


def rel_err(got, ref):
    got = torch.as_tensor(got)
    ref = torch.as_tensor(ref)
    return ((got - ref).abs().max() / ref.abs().max()).item()


def graph_node_names(t):
    seen, names, stack = set(), set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return names


def index_buffers(model):
    return [(n, b) for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] in INDEX_BUFFERS]


@pytest.fixture
def count_fused(monkeypatch):
    calls = []
    orig = snpu.InvertedResidual.forward_fused

    def counting(self, x, split_output):
        calls.append(split_output)
        return orig(self, x, split_output)

    monkeypatch.setattr(snpu.InvertedResidual, "forward_fused", counting)
    return calls


# --- the permutation ------------------------------------------------------------------------

@pytest.mark.parametrize("channels", [2, 8, 48, 116, 244])
def test_permutation_is_torchvision_channel_shuffle(channels):
    x = torch.arange(channels, dtype=torch.float64).view(1, channels, 1, 1)
    expected = tv_channel_shuffle(x, 2).flatten().long().tolist()
    perm = snpu.shuffle_permutation(channels)
    assert perm == expected
    assert perm == [(j % 2) * (channels // 2) + j // 2 for j in range(channels)]
    inv = snpu.inverse_permutation(perm)
    assert [perm[i] for i in inv] == list(range(channels))


# --- weights, outputs, gradients, BatchNorm statistics vs torchvision -----------------------

@pytest.mark.parametrize("width", WIDTHS)
def test_state_dict_is_torchvisions(width):
    tv, ours = make_pair(width)
    assert list(ours.state_dict().keys()) == list(tv.state_dict().keys())
    assert not any(k.rsplit(".", 1)[-1] in INDEX_BUFFERS for k in ours.state_dict())
    for k, v in ours.state_dict().items():
        assert torch.equal(v, tv.state_dict()[k]), k
    # and the other way round
    tv2 = torchvision.models.__dict__["shufflenet_v2_" + width](num_classes=NUM_CLASSES).double()
    tv2.load_state_dict(ours.state_dict(), strict=True)


def _compare_step(tv, ours, x, upstream):
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    out_tv = tv(xa)
    out = ours(xb)
    (out_tv * upstream).sum().backward()
    (out * upstream).sum().backward()
    assert torch.allclose(out, out_tv, rtol=0, atol=1e-9)
    assert torch.allclose(xb.grad, xa.grad, rtol=0, atol=1e-9)
    tv_params = dict(tv.named_parameters())
    n = 0
    for name, p in ours.named_parameters():
        assert p.grad is not None, name
        assert torch.allclose(p.grad, tv_params[name].grad, rtol=0, atol=1e-9), name
        n += 1
    assert n == len(tv_params)
    tv_state = tv.state_dict()
    for name, b in ours.state_dict().items():  # running_mean / running_var / num_batches_tracked
        assert torch.allclose(b.double(), tv_state[name].double(), rtol=0, atol=1e-9), name
    return out


@pytest.mark.parametrize("impl", ["index_select", "view"])
@pytest.mark.parametrize("width", WIDTHS)
def test_matches_torchvision_train_and_eval(width, impl, count_fused):
    tv, ours = make_pair(width)
    ours.set_shuffle_impl(impl)
    torch.manual_seed(1)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    upstream = torch.randn(2, NUM_CLASSES, dtype=torch.float64)

    tv.train()
    ours.train()
    out = _compare_step(tv, ours, x, upstream)
    nodes = graph_node_names(out)
    if impl == "index_select":
        # fused path: all 16 blocks, halves handed on (13 split outputs, 3 stage ends), no chunk
        assert len(count_fused) == 16 and count_fused.count(False) == 3
        assert CUSTOM_NODES <= nodes
        assert "SplitBackward0" not in nodes and "SliceBackward0" not in nodes
    else:
        assert not count_fused
        assert not (CUSTOM_NODES & nodes)
        assert "StackBackward0" in nodes
    # BatchNorm statistics moved in train mode (so the comparison above was not vacuous)
    assert not torch.allclose(tv.state_dict()["conv1.1.running_mean"],
                              torch.zeros_like(tv.state_dict()["conv1.1.running_mean"]))

    tv.eval()
    ours.eval()
    del count_fused[:]
    with torch.no_grad():
        assert torch.allclose(ours(x), tv(x), rtol=0, atol=1e-9)
    _compare_step(tv, ours, x, upstream)  # eval with grad enabled: plain path
    assert not count_fused


# --- the custom autograd Functions ----------------------------------------------------------

@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_functions_gradcheck(index_dtype):
    blk = snpu.InvertedResidual(8, 8, 1)
    idx = {n: getattr(blk, n).to(index_dtype) for n in INDEX_BUFFERS}
    torch.manual_seed(0)
    x1 = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)

    def full(a, b):
        return snpu._ConcatShuffle.apply(a, b, idx["shuffle_index"], idx["unshuffle_index1"],
                                         idx["unshuffle_index2"])

    def split(a, b):
        return snpu._ConcatShuffleSplit.apply(a, b, idx["shuffle_index1"], idx["shuffle_index2"],
                                              idx["unshuffle_index1"], idx["unshuffle_index2"])

    ref = tv_channel_shuffle(torch.cat((x1, x2), 1), 2)
    assert torch.equal(full(x1, x2), ref)
    h1, h2 = split(x1, x2)
    assert torch.equal(h1, ref[:, :4]) and torch.equal(h2, ref[:, 4:])
    assert h1.is_contiguous() and h2.is_contiguous()
    assert torch.autograd.gradcheck(full, (x1, x2))
    assert torch.autograd.gradcheck(split, (x1, x2))
    assert torch.autograd.gradgradcheck(full, (x1, x2))
    assert torch.autograd.gradgradcheck(split, (x1, x2))


# --- index buffers --------------------------------------------------------------------------

def test_index_buffers_dtype_device_and_state_dict():
    m = models.get_model("shufflenet_v2_x0_5_npu", num_classes=NUM_CLASSES)
    bufs = index_buffers(m)
    assert len(bufs) == 16 * len(INDEX_BUFFERS)
    assert all(b.dtype == torch.int64 for _, b in bufs)
    assert not set(n for n, _ in bufs) & set(m.state_dict())

    m.double()
    assert all(b.dtype == torch.int64 for _, b in index_buffers(m))
    assert m.fc.weight.dtype == torch.float64
    m.half()
    assert all(b.dtype == torch.int64 for _, b in index_buffers(m))
    m.float()

    assert m.set_index_dtype(torch.int32) is m
    assert all(b.dtype == torch.int32 for _, b in index_buffers(m))
    m.double()
    assert all(b.dtype == torch.int32 for _, b in index_buffers(m))
    with pytest.raises(ValueError):
        m.set_index_dtype(torch.float32)

    m.to("meta")  # follows .to(device) like any buffer
    assert all(b.device.type == "meta" for _, b in index_buffers(m))
    assert all(b.dtype == torch.int32 for _, b in index_buffers(m))
    if torch.cuda.is_available():
        m2 = models.get_model("shufflenet_v2_x0_5_npu").cuda()
        assert all(b.is_cuda for _, b in index_buffers(m2))


def test_int32_indices_same_results(count_fused):
    tv, ours = make_pair("x0_5")
    ours.set_shuffle_impl("index_select").set_index_dtype(torch.int32)
    torch.manual_seed(2)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    upstream = torch.randn(2, NUM_CLASSES, dtype=torch.float64)
    _compare_step(tv.train(), ours.train(), x, upstream)
    assert len(count_fused) == 16


# --- the rule that picks the path -----------------------------------------------------------

def test_path_rule(count_fused):
    m = models.get_model("shufflenet_v2_x0_5_npu", num_classes=NUM_CLASSES)
    assert m.shuffle_impl == "auto"
    x = torch.randn(2, 3, 32, 32)
    m.train()
    m(x)  # auto on CPU -> view, plain ops
    assert not count_fused
    blk = m.stage2[1]
    npu_like = types.SimpleNamespace(device=types.SimpleNamespace(type="npu"))
    assert blk._use_index_select(npu_like)
    assert not blk._use_index_select(x)

    m.shuffle_impl = "index_select"
    assert all(b.shuffle_impl == "index_select" for b in m._blocks())
    with torch.no_grad():
        m(x)
    assert not count_fused  # training without grad: plain path
    m.eval()
    m(x)
    assert not count_fused  # eval with grad: plain path
    m.train()
    torch.jit.trace(m, x, check_trace=False)
    assert not count_fused  # tracing: plain path
    m(x)
    assert len(count_fused) == 16  # training with grad: fused
    with pytest.raises(ValueError):
        m.set_shuffle_impl("transpose")


# --- export paths ---------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["auto", "index_select"])
def test_onnx_export_matches_onnxruntime(tmp_path, impl):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    torch.manual_seed(0)
    m = models.get_model("shufflenet_v2_x1_0_npu", num_classes=NUM_CLASSES, shuffle_impl=impl)
    calibrate_bn(m, size=64)
    path = str(tmp_path / "shufflenet_npu.onnx")
    kwargs = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False  # the TorchScript exporter is the one that does opset 11
    torch.onnx.export(m, torch.randn(1, 3, 64, 64), path, opset_version=11,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, **kwargs)
    import onnx
    # index_select exports as Gather on axis 1 (one per block); the view form has none
    # (shape arithmetic of dynamic axes also uses Gather, on axis 0).
    channel_gathers = [n for n in onnx.load(path).graph.node if n.op_type == "Gather" and
                       any(a.name == "axis" and a.i == 1 for a in n.attribute)]
    assert len(channel_gathers) == (16 if impl == "index_select" else 0)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = torch.randn(batch, 3, 64, 64)
        with torch.no_grad():
            ref = m(x).numpy()
        got = sess.run(None, {"input": x.numpy()})[0]
        assert got.shape == (batch, NUM_CLASSES)
        assert abs(ref).max() > 0.1  # outputs of a useful scale for the tolerance below
        assert abs(got - ref).max() < 1e-4


def test_torchscript_script_and_trace():
    tv, ours = make_pair("x0_5", dtype=torch.float32)
    calibrate_bn(tv)
    ours.load_state_dict(tv.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = tv(x)
    scripted = torch.jit.script(ours.eval())  # one script holds both forms; switch per block
    for impl in ("index_select", "view"):
        for stage in (scripted.stage2, scripted.stage3, scripted.stage4):
            for blk in stage.children():
                blk.shuffle_impl = impl
        with torch.no_grad():
            assert rel_err(scripted(x), ref) < 1e-5
    ours.set_shuffle_impl("index_select")
    traced = torch.jit.trace(ours, x)
    assert "aten::index_select" in str(traced.inlined_graph)
    with torch.no_grad():
        assert rel_err(traced(x), ref) < 1e-5


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_fullgraph_train(count_fused):
    tv, ours = make_pair("x0_5", dtype=torch.float32)
    ours.set_shuffle_impl("index_select").train()
    tv.train()
    compiled = torch.compile(ours, backend="eager", fullgraph=True)
    x = torch.randn(2, 3, 32, 32)
    out = compiled(x)
    assert not count_fused  # under torch.compile: plain ops, no custom Functions
    assert rel_err(out, tv(x)) < 1e-5
    out.sum().backward()
    assert ours.fc.weight.grad is not None


# --- registry -------------------------------------------------------------------------------

@ONCE
def test_registry():
    names = models.list_models()
    for width in WIDTHS:
        assert "shufflenet_v2_{}_npu".format(width) in names
    m = models.get_model("shufflenet_v2_x1_0_npu", num_classes=10)
    assert isinstance(m, snpu.ShuffleNetV2NPU)
    assert m.fc.out_features == 10
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    m5 = models.get_model("shufflenet_v2_x0_5_npu", num_classes=10, shuffle_impl="index_select")
    assert m5.shuffle_impl == "index_select"
