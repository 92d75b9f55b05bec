"""LSTM, GRU and RNN on the GPU (``optcli/gpu/ops_recurrent.py``, ``kernels/gpu/recurrent.cl``):
every attribute combination of ``CASES`` run through the kernel against the host reference (every
packed output element written, padding lanes zero), and end to end on ``opencl,arm`` with
``require_gpu=True`` against onnxruntime, at fp32 and fp16.  onnxruntime refuses layout 1: it runs
the layout-0 model on transposed data, and its outputs are transposed back."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.gpu import ops_recurrent
from optcli.gpu.layout import c4, dims4, pack, packed_elements, unpack
from optcli.gpu.registry import gpu_kernels_for
from optcli.runtime.opencl.device import ClLaunchContext, cl, packed_nbytes
from tests.gpu.harness import device, one_node_graph, reference
from tests.helpers import assert_close, run_ort

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
KEEP_ON_GPU = {"keep_small_islands_on_host"}  # one-node models would otherwise go back to the CPU


@dataclass(frozen=True)
class RecurrentCase:
    """One recurrent node: its attributes and which optional inputs / outputs it has.  ``lens``:
    None, "data" (a graph input) or "const"; ``data_weights``: W, R, B and P graph inputs, not
    constants; ``outputs``: which of Y, Y_h (, Y_c) are asked for."""

    id: str
    op: str
    attrs: dict = field(default_factory=dict)
    seq: int = 5
    batch: int = 3
    inp: int = 4
    hidden: int = 6
    bias: bool = True
    h0: bool = False
    c0: bool = False
    lens: str | None = None
    peepholes: bool = False
    data_weights: bool = False
    outputs: tuple[bool, ...] = (True, True, True)

    @property
    def dirs(self) -> int:
        return 2 if self.attrs.get("direction") == "bidirectional" else 1

    @property
    def batch_first(self) -> bool:
        return int(self.attrs.get("layout", 0)) == 1

    def arrays(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str], list[str]]:
        """(data inputs, constants, the node's input names, its output names), seeded by the id."""
        rng = np.random.default_rng(sum(map(ord, self.id)))
        g, h, d = GATES[self.op], self.hidden, self.dirs
        seq_batch = (self.batch, self.seq) if self.batch_first else (self.seq, self.batch)
        state = (self.batch, d, h) if self.batch_first else (d, self.batch, h)
        data = {"x": rng.standard_normal((*seq_batch, self.inp)).astype(np.float32)}
        consts = {"W": rng.uniform(-0.6, 0.6, (d, g * h, self.inp)).astype(np.float32),
                  "R": rng.uniform(-0.6, 0.6, (d, g * h, h)).astype(np.float32)}
        names = ["x", "W", "R", "B" if self.bias else "", "", "", "", ""]
        if self.bias:
            consts["B"] = rng.uniform(-0.5, 0.5, (d, 2 * g * h)).astype(np.float32)
        if self.lens:
            lens = np.array([(self.seq, 0, 2, self.seq - 1, 1)[i % 5] for i in range(self.batch)], np.int32)
            (data if self.lens == "data" else consts)["lens"] = lens
            names[4] = "lens"
        for k, key, wanted in ((5, "h0", self.h0), (6, "c0", self.c0)):
            if wanted:
                data[key] = rng.standard_normal(state).astype(np.float32)
                names[k] = key
        if self.peepholes:
            consts["P"] = rng.uniform(-0.5, 0.5, (d, 3 * h)).astype(np.float32)
            names[7] = "P"
        if self.data_weights:
            data.update({k: consts.pop(k) for k in ("W", "R", "B", "P") if k in consts})
        while names and not names[-1]:
            names.pop()
        outs = [name if wanted else "" for name, wanted in zip(("y", "y_h", "y_c"), self.outputs[:len(self.states)])]
        return data, consts, names, outs

    @property
    def states(self) -> tuple[str, ...]:
        return ("Y", "Y_h", "Y_c") if self.op == "LSTM" else ("Y", "Y_h")

    def model(self, batch_first: bool | None = None) -> onnx.ModelProto:
        """The one-node ONNX model (with ``batch_first=False``: the same layer in layout 0)."""
        data, consts, names, outs = self.arrays()
        attrs = {"hidden_size": self.hidden, **self.attrs}
        if batch_first is False:
            attrs.pop("layout", None)
            data = {k: _to_layout0(k, v) if self.batch_first else v for k, v in data.items()}
        while not outs[-1]:
            outs = outs[:-1]
        node = helper.make_node(self.op, names, outs, **attrs)
        inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                  for k, v in data.items()]
        graph = helper.make_graph([node], self.id, inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                            for o in outs if o],
                                  [numpy_helper.from_array(v, k) for k, v in consts.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def _to_layout0(name: str, value: np.ndarray) -> np.ndarray:
    return value.transpose(1, 0, 2) if name in ("x", "h0", "c0") else value


def _case(op: str, id_: str, **kw) -> RecurrentCase:
    return RecurrentCase(f"{op.lower()}-{id_}", op, **kw)


BIDI, REVERSE, BATCH_FIRST = {"direction": "bidirectional"}, {"direction": "reverse"}, {"layout": 1}
CASES = [
    _case("LSTM", "forward", h0=True, c0=True),
    _case("LSTM", "no-bias-no-state-batch5", batch=5, bias=False),
    _case("LSTM", "reverse", attrs=REVERSE, h0=True, c0=True),
    _case("LSTM", "bidirectional", attrs=BIDI, batch=5, h0=True, c0=True),
    _case("LSTM", "lens", batch=5, lens="data", h0=True, c0=True),
    _case("LSTM", "lens-reverse", attrs=REVERSE, batch=5, lens="data", h0=True),
    _case("LSTM", "lens-bidirectional-const", attrs=BIDI, batch=5, lens="const", c0=True),
    _case("LSTM", "peepholes", attrs=BIDI, h0=True, c0=True, peepholes=True),
    _case("LSTM", "clip", attrs={"clip": 0.5}, h0=True, c0=True),
    _case("LSTM", "input-forget", attrs={"input_forget": 1}, peepholes=True, c0=True),
    _case("LSTM", "layout1", attrs=BATCH_FIRST, seq=6, batch=2, h0=True, c0=True),
    _case("LSTM", "layout1-bidirectional-lens", attrs={**BATCH_FIRST, **BIDI}, batch=5, lens="data", h0=True,
          c0=True, peepholes=True),
    _case("LSTM", "activations", attrs={"activations": ["HardSigmoid", "LeakyRelu", "Relu"],
                                        "activation_alpha": [0.3, 0.05], "activation_beta": [0.4]}, h0=True),
    _case("LSTM", "activations-per-direction",
          attrs={**BIDI, "clip": 2.0, "activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Relu", "LeakyRelu"]}),
    _case("LSTM", "only-y_h", outputs=(False, True, False), h0=True),
    _case("LSTM", "only-y_c", attrs=BIDI, outputs=(False, False, True), lens="data", batch=5),
    _case("LSTM", "data-weights", attrs=BIDI, batch=5, h0=True, c0=True, peepholes=True, data_weights=True),
    _case("GRU", "forward", h0=True),
    _case("GRU", "linear-before-reset", attrs={"linear_before_reset": 1}, h0=True),
    _case("GRU", "reverse", attrs=REVERSE, batch=5),
    _case("GRU", "bidirectional-lbr", attrs={**BIDI, "linear_before_reset": 1}, batch=5, h0=True),
    _case("GRU", "lens-bidirectional", attrs=BIDI, batch=5, lens="data", h0=True),
    _case("GRU", "clip-activations", attrs={"clip": 0.5, "activations": ["HardSigmoid", "LeakyRelu"],
                                            "activation_alpha": [0.25, 0.1]}),
    _case("GRU", "layout1-lens", attrs={**BATCH_FIRST, **REVERSE, "linear_before_reset": 1}, seq=6, batch=5,
          lens="data", h0=True),
    _case("GRU", "only-y_h", outputs=(False, True), bias=False),
    _case("GRU", "data-weights", attrs={**BATCH_FIRST, "clip": 1.5}, lens="data", data_weights=True),
    _case("GRU", "data-weights-lbr-no-bias", attrs={"linear_before_reset": 1}, bias=False, data_weights=True),
    _case("RNN", "forward", h0=True),
    _case("RNN", "data-weights", attrs=REVERSE, h0=True, data_weights=True),
    _case("RNN", "bidirectional-lens", attrs=BIDI, batch=5, lens="data", h0=True),
    _case("RNN", "layout1-relu-clip", attrs={**BATCH_FIRST, "activations": ["Relu"], "clip": 1.0}, batch=5),
]


def node_of(case: RecurrentCase):
    """The case as a one-node IR graph (outputs y0..), its node and its data feeds."""
    data, consts, names, outs = case.arrays()
    graph, node = one_node_graph(case.op, data, consts, {"hidden_size": case.hidden, **case.attrs},
                                 n_outputs=len(case.states), input_names=names)
    node.outputs = [o if want else "" for o, want in zip(node.outputs, outs)]
    return graph, node, data


def run_packed(graph, node, feeds: dict[str, np.ndarray], precision: str,
               split_groups: bool = False) -> dict[str, np.ndarray]:
    """The GPU kernel's packed outputs (each prefilled with NaN: every element, padding lanes
    included, must be written).  ``split_groups``: the whole-sequence launch gets a local size half
    its grid, as a tuned one could give it (its first work-group must then run it alone)."""
    kern = gpu_kernels_for(node.op_type)[0]
    assert kern.check(node, graph) is None, kern.check(node, graph)
    dev = device()
    storage = np.float16 if precision == "fp16" else np.float32
    shapes = {n: tuple(graph.shape_of(n)) for n in [*node.inputs, *node.outputs] if n and n not in graph.initializers}
    buffers = {n: cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                            hostbuf=pack(x, storage)) for n, x in feeds.items()}
    outputs = [o for o in node.outputs if o]
    for o in outputs:
        fill = np.full(packed_nbytes(shapes[o], precision) // np.dtype(storage).itemsize, np.nan, storage)
        buffers[o] = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=fill)
    ctx = ClLaunchContext(dev, shapes, dict(graph.initializers), buffers, precision)
    ctx.namespace = kern.id
    for launch in kern.launch(ctx, node):
        if split_groups and launch.local_size:
            launch.local_size = (launch.local_size[0] // 2, 1, 1)
        ctx.bind(launch, node.name).enqueue(dev.queue)
    result = {}
    for o in outputs:
        host = np.empty(packed_nbytes(shapes[o], precision) // np.dtype(storage).itemsize, storage)
        cl.enqueue_copy(dev.queue, host, buffers[o])
        result[o] = host[:packed_elements(shapes[o])].astype(np.float32)
    dev.queue.finish()
    return result


# How the recurrence is launched (ops_recurrent's two ways): the whole sequence in one launch, its
# work-group as wide as the layer (the default for these small layers); the same with a work-group
# of 4 (work items take several units each), and split by a tuned local size; one launch per step.
LAUNCH_MODES = {"whole": {}, "whole-group4": {"SEQUENCE_GROUP": 4},
                "whole-split": {"SEQUENCE_GROUP": 4, "split": True}, "per-step": {"WHOLE_SEQUENCE_HIDDEN": 0}}


@pytest.mark.parametrize("mode", ["whole", "fp16", "whole-group4", "whole-split", "per-step"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_against_the_host(case, mode, monkeypatch):
    precision = "fp16" if mode == "fp16" else "fp32"
    settings = dict(LAUNCH_MODES.get(mode, {}))
    split = settings.pop("split", False)
    for name, value in settings.items():
        monkeypatch.setattr(ops_recurrent, name, value)
    graph, node, feeds = node_of(case)
    expected = reference(graph, node, feeds)
    packed = run_packed(graph, node, feeds, precision, split_groups=split)
    for name, want in zip(node.outputs, expected):
        if not name:
            continue
        shape = graph.shape_of(name)
        assert not np.isnan(packed[name]).any(), f"{case.id} {name}: elements left unwritten"
        n, c, h, w = dims4(shape)
        if c % 4:
            lanes = packed[name].reshape(n, c4(c), h, w, 4)[:, -1, :, :, c % 4:]
            assert np.all(lanes == 0), f"{case.id} {name}: padding lanes not zero"
        assert_close(unpack(packed[name], shape), want, precision, what=f"{case.id} {name} ({precision})")


def _onnxruntime(case: RecurrentCase, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    if not case.batch_first:
        return run_ort(case.model(), feeds)
    outs = run_ort(case.model(batch_first=False), {k: _to_layout0(k, v) for k, v in feeds.items()})
    return [y.transpose(2, 0, 1, 3) if y.ndim == 4 else y.transpose(1, 0, 2) for y in outs]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_on_opencl_against_onnxruntime(case, precision):
    feeds = case.arrays()[0]
    result = optcli.optimize(model=case.model(), valid_targets="opencl,arm", precision=precision,
                             disabled_passes=KEEP_ON_GPU)
    steps = [s for s in result.report["steps"] if s["op"] == case.op]
    assert [s["target"] for s in steps] == ["opencl"], steps
    outputs = optcli.load(result.data, require_gpu=True).run(feeds)
    names = [o for o in case.arrays()[3] if o]
    for name, want in zip(names, _onnxruntime(case, feeds)):
        assert_close(outputs[name], want, precision, what=f"{case.id} {name} ({precision}) against onnxruntime")


def test_launch_counts(monkeypatch):
    """After the projection and the initial states, one launch for the whole sequence; wider layers
    one launch per step (GRU with linear_before_reset 0: two), both directions in the same one."""
    def count(case: RecurrentCase) -> dict[str, int]:
        graph, node, _ = node_of(case)
        ctx = ClLaunchContext(device(), {n: tuple(graph.shape_of(n)) for n in [*node.inputs, *node.outputs] if n},
                              dict(graph.initializers), {})
        entries: dict[str, int] = {}
        for launch in gpu_kernels_for(case.op)[0].launch(ctx, node):
            entries[launch.entry] = entries.get(launch.entry, 0) + 1
        return entries

    once = {"recurrent_project": 1, "recurrent_init": 1, "recurrent_steps": 1}
    assert count(_case("LSTM", "count", attrs=BIDI)) == once
    assert count(_case("GRU", "count")) == once
    monkeypatch.setattr(ops_recurrent, "WHOLE_SEQUENCE_HIDDEN", 5)  # the cases have 6 hidden units
    per_step = {**once, "recurrent_steps": 5}
    assert count(_case("LSTM", "count", attrs=BIDI)) == per_step
    assert count(_case("GRU", "count", attrs={"linear_before_reset": 1})) == per_step
    assert count(_case("GRU", "count")) == {**once, "recurrent_steps": 10}


def _reason(case: RecurrentCase, **changes) -> str | None:
    graph, node, _ = node_of(case)
    node.attrs.update(changes)
    return gpu_kernels_for(case.op)[0].check(node, graph)


def test_what_stays_on_the_host():
    lstm = _case("LSTM", "check")
    assert _reason(lstm) is None
    assert "activation elu has no GPU code" in _reason(lstm, activations=["Sigmoid", "Elu", "Tanh"])
    assert "activation affine, softsign has no GPU code" in _reason(_case("GRU", "check"),
                                                                  activations=["Softsign", "Affine"])
    assert "activations" in _reason(lstm, activations=["Sigmoid", "Tanh"])  # two of three
    assert "direction 'sideways'" in _reason(lstm, direction="sideways")
    graph, node, _ = node_of(_case("LSTM", "check-data-weights", data_weights=True))
    assert gpu_kernels_for("LSTM")[0].check(node, graph) is None  # re-laid on the device
    graph.values["R"].shape = ("hidden", 4, 6)
    assert "'R' has a dynamic shape" in gpu_kernels_for("LSTM")[0].check(node, graph)
    graph, node, _ = node_of(_case("RNN", "check-lens", lens="data"))
    graph.values["lens"].dtype = "int64"
    assert "sequence_lens is int32" in gpu_kernels_for("RNN")[0].check(node, graph)
    graph, node, _ = node_of(_case("GRU", "check-lens", lens="const"))
    graph.initializers["lens"] = np.array([9, 1, 1], np.int32)
    assert "outside 0..5" in gpu_kernels_for("GRU")[0].check(node, graph)


def test_an_activation_without_gpu_code_runs_on_the_host():
    case = _case("RNN", "softsign", attrs={"activations": ["Softsign"]})
    result = optcli.optimize(model=case.model(), valid_targets="opencl,arm", disabled_passes=KEEP_ON_GPU)
    assert [s["target"] for s in result.report["steps"] if s["op"] == "RNN"] == ["arm"]
    feeds = case.arrays()[0]
    outputs = optcli.load(result.data).run(feeds)
    for name, want in zip(("y", "y_h"), run_ort(case.model(), feeds)):
        assert_close(outputs[name], want, what=f"{name} on the host")
