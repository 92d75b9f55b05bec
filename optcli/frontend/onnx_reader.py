"""Read an ONNX model (a file, or a directory with external data) into the IR.

Every way a model can be bad is turned into a ``ModelError`` that names the file and, where
there is one, the node: unreadable protobuf, external data that escapes the model directory,
opsets outside the range we support, graphs the ONNX checker rejects.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from optcli.errors import ModelError
from optcli.frontend.declared_shapes import reconcile, restore_where_silent, set_aside
from optcli.frontend.input_shapes import MAX_ELEMENTS, apply_input_shapes, infer_shapes, normalize_negative_dims
from optcli.ir import Graph, Node, Value
from optcli.ops.reference import node_from_proto

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()


def given_model_path(model_file: str | Path | None, model_dir: str | Path | None) -> tuple[bool, Path]:
    """``(is_file, path)`` of the one of ``--model_file`` / ``--model_dir`` given, which must exist."""
    if bool(model_file) == bool(model_dir):
        raise ModelError("give exactly one of --model_file=FILE or --model_dir=DIR")
    if model_file:
        path = Path(model_file)
        if not path.is_file():
            raise ModelError(f"{path}: no such model file; check --model_file")
        return True, path
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ModelError(f"{folder}: no such directory; check --model_dir")
    return False, folder


def find_model_file(model_file: str | None, model_dir: str | None) -> Path:
    """Resolve ``--model_file`` / ``--model_dir`` to the ``.onnx`` file to read."""
    is_file, folder = given_model_path(model_file, model_dir)
    if is_file:
        return folder
    if (folder / "model.onnx").is_file():
        return folder / "model.onnx"
    found = sorted(p for p in folder.glob("*.onnx") if p.is_file())
    if len(found) != 1:
        what = "no .onnx file" if not found else f"{len(found)} .onnx files ({', '.join(p.name for p in found)})"
        raise ModelError(f"{folder}: holds {what}; put exactly one there or name it model.onnx")
    return found[0]


def load_onnx(path: Path) -> onnx.ModelProto:
    """Parse the protobuf and load external data, refusing paths outside the model's folder."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, but truncation shows up variously
        raise ModelError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc}); "
                         "check that the file is complete and really ONNX") from None
    if not model.HasField("graph"):
        raise ModelError(f"{path}: the file holds no graph; is it really an ONNX model?")
    _check_external_data(model, path)
    if any(external_data_helper.uses_external_data(t) for t in external_data_helper._get_all_tensors(model)):
        try:
            external_data_helper.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:
            raise ModelError(f"{path}: cannot read external data ({exc})") from None
    return model


def weight_budget() -> int:
    """Bytes of weights `opt` will read: half the machine's memory, or ``OPTCLI_MAX_WEIGHT_BYTES``."""
    env = os.environ.get("OPTCLI_MAX_WEIGHT_BYTES")
    if env and env.isdigit():
        return int(env)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): a generous fixed bound
        return 8 << 30


def _declared_bytes(tensor: onnx.TensorProto) -> int | None:
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:  # noqa: BLE001 - a type numpy cannot name: the reader reports it later
        return None
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * itemsize


def _check_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Paths stay inside the model's folder, and sizes are checked before anything is read:
    each tensor's bytes must match its declared shape, and all of them fit the memory budget (a
    sparse 16 GiB file takes 8 KB on disk and would otherwise be read until the kernel kills us)."""
    base = path.parent.resolve()
    budget, total = weight_budget(), 0
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        target = (base / location).resolve()
        if os.path.isabs(location) or not target.is_relative_to(base):
            raise ModelError(f"{path}: tensor '{tensor.name}' points at external data '{location}' outside "
                             "the model directory; refusing to read it")
        if not target.is_file():
            raise ModelError(f"{path}: tensor '{tensor.name}' needs external data file '{location}', which is "
                             "missing; copy it beside the model")
        try:
            offset, length = int(info.get("offset", 0) or 0), int(info.get("length", 0) or 0)
        except ValueError:
            raise ModelError(f"{path}: tensor '{tensor.name}' has a non-numeric external data offset or "
                             f"length ({info.get('offset')!r:.40}, {info.get('length')!r:.40}); the model is "
                             "damaged") from None
        if offset < 0 or length < 0:
            raise ModelError(f"{path}: tensor '{tensor.name}' has a negative external data offset or length; "
                             "the model is damaged")
        if offset + length > target.stat().st_size:
            raise ModelError(f"{path}: tensor '{tensor.name}' reads past the end of '{location}'; "
                             "the external data file is truncated")
        declared = _declared_bytes(tensor)
        size = length or max(target.stat().st_size - offset, 0)
        if declared is not None and size != declared:
            raise ModelError(f"{path}: tensor '{tensor.name}' declares {declared} bytes of external data but "
                             f"'{location}' gives it {size}; the model or its data file is damaged")
        total += size
        if total > budget:
            raise ModelError(f"{path}: the external data adds up to more than {budget >> 20} MiB (at tensor "
                             f"'{tensor.name}', {size >> 20} MiB), over the memory budget for weights; set "
                             "OPTCLI_MAX_WEIGHT_BYTES if this machine really holds it")


def check_opsets(model: onnx.ModelProto, path: Path) -> dict[str, int]:
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    version = opsets.get("")
    if version is None and not any(n.domain in ("", "ai.onnx") for n in model.graph.node):
        return opsets  # e.g. a model of ai.onnx.ml ops only
    if version is None:
        raise ModelError(f"{path}: the model imports no default ONNX opset; re-export it with opset "
                         f"{MIN_OPSET}..{MAX_OPSET}")
    if not MIN_OPSET <= version <= MAX_OPSET:
        raise ModelError(f"{path}: opset {version} is outside the supported range {MIN_OPSET}..{MAX_OPSET}; "
                         "convert it with onnx.version_converter")
    return opsets


def _inline_functions(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """The model's local functions inlined (onnx does not import its ``inliner`` with ``onnx``);
    what the inliner refuses (a function calling itself, a call to an undefined function) is the
    model's fault."""
    import onnx.inliner

    try:
        return onnx.inliner.inline_local_functions(model)
    except Exception as exc:  # the inliner raises plain RuntimeError/ValueError on bad functions
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ModelError(f"{path}: the model's local functions cannot be inlined ({text[:300]}); check the "
                         "functions the exporter wrote (recursion is not allowed in ONNX)") from None


def read_model(
    model_file: str | None = None,
    model_dir: str | None = None,
    input_shapes: dict[str, list[int]] | None = None,
    model: onnx.ModelProto | None = None,
    warnings: list[str] | None = None,
    strict: bool = False,
    label: str | None = None,
) -> Graph:
    """Read, validate, pin input shapes, infer shapes and convert to the IR.  What the model
    declares and the graph does not compute is appended to ``warnings`` (when given).  ``strict``
    (what ``opt`` asks): a node whose inputs' shapes do not fit it is a ``ModelError``; tests that
    build such a node on purpose (to see a kernel check refuse it) leave it off.  ``label`` names an
    in-memory ``model`` in messages (the Paddle or TFLite file it was converted from)."""
    path = Path(label or "<memory>") if model is not None else find_model_file(model_file, model_dir)
    if model is None:
        model = load_onnx(path)
    else:
        model = _copy(model)  # pinning shapes edits the proto: never the caller's
    opsets = check_opsets(model, path)
    if model.functions:
        model = _inline_functions(model, path)
    check_names(model.graph, path)
    check_dataflow(model.graph, path)
    normalize_negative_dims(model)
    apply_input_shapes(model, input_shapes or {}, path)
    # Inference first: it fills in output types exporters leave out, which the checker demands.
    # Declared output and value_info shapes are hints: inference computes them from the inputs.
    found: list[str] = []
    declared = set_aside(model)
    model = infer_shapes(model, path)
    if restore_where_silent(model, declared, found):
        model = infer_shapes(model, path)  # what follows a value only its declaration shapes
    axis_nodes = _quantize_axis_below_13(model, opsets)
    if axis_nodes:
        found.append(f"{len(axis_nodes)} QuantizeLinear/DequantizeLinear node(s) (first: '{axis_nodes[0]}') carry "
                     f"the per-channel 'axis' of opset 13 in an opset-{opsets['']} model (onnxruntime's quantizer "
                     "writes them so); optcli reads the attribute as opset 13 defines it. Re-export with opset 13 or "
                     "newer to make the model valid ONNX")
    try:
        onnx.checker.check_model(_typed_outputs_for_checker(model, bool(axis_nodes)))
    except onnx.checker.ValidationError as exc:
        # The checker's messages span lines (they print the node): one line, bounded, for the CLI.
        text = " ".join(str(exc).split()) or "invalid model"
        raise ModelError(f"{path}: the ONNX checker rejects the model: {text[:300]}") from None
    check_static_sizes(model, path)
    graph = to_ir(model, opsets)
    reconcile(graph, declared, found, str(path), strict)
    if warnings is not None:
        warnings.extend(found)
    graph.metadata["source"] = path.name
    graph.toposort()
    return graph


def check_names(graph: onnx.GraphProto, path: Path) -> None:
    """Every name is text.  Protobuf hands back ``bytes`` for a string field that is not valid
    UTF-8 (the spec requires UTF-8); such a name would reach the writer as bytes."""
    named = [("graph input", vi.name) for vi in graph.input] + [("graph output", vi.name) for vi in graph.output]
    named += [("value", vi.name) for vi in graph.value_info] + [("initializer", t.name) for t in graph.initializer]
    for i, node in enumerate(graph.node):
        named += [("node", node.name), ("node op type", node.op_type), ("node domain", node.domain)]
        named += [(f"value read by node #{i}", n) for n in node.input]
        named += [(f"value written by node #{i}", n) for n in node.output]
    for what, name in named:
        if isinstance(name, bytes):
            raise ModelError(f"{path}: a {what} name is not valid UTF-8 ({name[:60]!r}); ONNX names must be "
                             "UTF-8 text: rename it in the exporter or with onnx.helper")


def check_dataflow(graph: onnx.GraphProto, path: Path) -> None:
    """Every node input is defined (graph input, initializer or node output), and the nodes have
    an order in which each runs after what it reads: no cycles.  Clear messages for what the
    ONNX checker reports as "not topologically sorted"."""
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer} | {""}
    defined |= {t.values.name for t in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if out:
                producer[out] = i
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name not in defined and name not in producer:
                raise ModelError(f"{path}: {_label(node, i)} reads '{name:.80}', which no node, graph input or "
                                 "initializer defines; the model is incomplete (missing initializer?)")
    # Kahn's algorithm over the explicit inputs.
    waiting = [len({producer[n] for n in node.input if n in producer and n not in defined}) for node in graph.node]
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(graph.node):
        for src in {producer[n] for n in node.input if n in producer and n not in defined}:
            readers.setdefault(src, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in readers.get(i, []):
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if done != len(graph.node):
        stuck = [_label(graph.node[i], i) for i, w in enumerate(waiting) if w > 0][:3]
        raise ModelError(f"{path}: the graph has a cycle (nodes that wait on each other's outputs), involving "
                         f"{', '.join(stuck)}; an ONNX graph must be acyclic")


def check_static_sizes(model: onnx.ModelProto, path: Path) -> None:
    """Refuse values whose inferred static shape is absurd (more elements than any device holds):
    a Reshape or Expand to a typo'd shape would otherwise reach the planner and the runtime."""
    g = model.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
            continue
        count = 1
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                count *= max(d.dim_value, 1)
        if count > MAX_ELEMENTS:
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
            raise ModelError(f"{path}: value '{vi.name:.80}' has an absurd shape {dims} ({count} elements); "
                             "fix the model or pin smaller dims with --input_shapes")


def _label(node: onnx.NodeProto, index: int) -> str:
    return f"node '{node.name or f'{node.op_type}_{index}'}' ({node.op_type})"


def to_ir(model: onnx.ModelProto, opsets: dict[str, int]) -> Graph:
    g = model.graph
    initializers = {t.name: _weight(t) for t in g.initializer}
    for sparse in g.sparse_initializer:
        initializers[sparse.values.name] = _dense(sparse)
    # A graph input's declaration is the fact: an output or value_info of the same name is not.
    values = {vi.name: _value(vi) for vi in [*g.value_info, *g.output, *g.input]}
    inputs = [values[vi.name] for vi in g.input if vi.name not in initializers]
    outputs = [values[vi.name] for vi in g.output]
    nodes, used = [], set()
    for i, proto in enumerate(g.node):
        nodes.append(_node(proto, i, used))
    meta = {p.key: p.value for p in model.metadata_props}
    return Graph(g.name or "model", nodes, inputs, outputs, initializers, values, opsets, meta)


def _weight(tensor: onnx.TensorProto) -> np.ndarray:
    """A weight as numpy, or a ModelError naming it: absurd dims (``[0, 2**62]`` holds nothing,
    yet numpy refuses the shape) and data that does not fit the dims are the model's fault."""
    extent = 1
    for d in tensor.dims:
        extent *= max(int(d), 1)
    if any(int(d) < 0 for d in tensor.dims) or extent > MAX_ELEMENTS:
        raise ModelError(f"initializer '{tensor.name:.80}' has dims {list(tensor.dims)[:8]}, which no tensor can "
                         "have; the model is damaged")
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as exc:
        raise ModelError(f"initializer '{tensor.name:.80}' cannot be read ({exc}); its data does not match its "
                         "dims or type: the model is damaged") from None


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    if int(np.prod([max(int(d), 1) for d in sparse.dims], dtype=np.float64)) > MAX_ELEMENTS or min(
            sparse.dims, default=0) < 0:
        raise ModelError(f"sparse initializer '{sparse.values.name:.80}' has dims {list(sparse.dims)[:8]}, too large "
                         "to make dense; the model is damaged")
    values = numpy_helper.to_array(sparse.values)
    idx = numpy_helper.to_array(sparse.indices)
    dense = np.zeros(int(np.prod(sparse.dims)), dtype=values.dtype)
    if idx.ndim == 2:
        idx = np.ravel_multi_index(idx.T, tuple(sparse.dims))
    dense[idx] = values
    return dense.reshape(tuple(sparse.dims))


def _value(vi: onnx.ValueInfoProto) -> Value:
    t = vi.type.tensor_type
    dtype = "float32"
    if vi.type.HasField("tensor_type") and t.elem_type:
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).name
        except Exception:
            dtype = "unknown"
    shape = None
    if t.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return Value(vi.name, dtype, shape)


def _node(proto: onnx.NodeProto, index: int, used: set[str]) -> Node:
    name = proto.name or f"{proto.op_type}_{index}"
    while name in used:
        name = f"{name}_{index}"
    used.add(name)
    return node_from_proto(proto, name)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    return clone


QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def _quantize_axis_below_13(model: onnx.ModelProto, opsets: dict[str, int]) -> list[str]:
    """Names of the main graph's QuantizeLinear / DequantizeLinear nodes with an ``axis`` attribute
    in a model whose default opset is below 13, where the schema has no ``axis``.  onnxruntime's
    ``quantize_static`` (per_channel=True) writes them into opset-10..12 models; the attribute can
    only mean what opset 13 says (per-channel along ``axis``), and our kernels read it so."""
    if opsets.get("", 13) >= 13:
        return []
    return [n.name or f"#{i}" for i, n in enumerate(model.graph.node)
            if n.op_type in QDQ_OPS and n.domain in ("", "ai.onnx") and any(a.name == "axis" for a in n.attribute)]


def _typed_outputs_for_checker(model: onnx.ModelProto, drop_quantize_axis: bool = False) -> onnx.ModelProto:
    """The checker demands a shape on every graph output; outputs of ops shape inference does
    not know (custom domains) have none.  Check a copy in which they get a placeholder type,
    so such models reach placement, which says clearly whether anything can run them.  With
    ``drop_quantize_axis``, the copy's Q/DQ nodes also lose the opset-13 ``axis`` that an older
    opset's schema rejects (``_quantize_axis_below_13``; the model itself keeps it)."""
    untyped = [o for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
    if not untyped and not drop_quantize_axis:
        return model
    clone = _copy(model)
    if drop_quantize_axis:
        for node in clone.graph.node:
            if node.op_type in QDQ_OPS and node.domain in ("", "ai.onnx"):
                kept = [a for a in node.attribute if a.name != "axis"]
                del node.attribute[:]
                node.attribute.extend(kept)
    for out in clone.graph.output:
        if not out.type.tensor_type.HasField("shape"):
            out.type.tensor_type.elem_type = out.type.tensor_type.elem_type or onnx.TensorProto.FLOAT
            out.type.tensor_type.shape.SetInParent()
    return clone
