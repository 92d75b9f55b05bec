"""`optcli inspect`: text for people, JSON for machines, the graph picture."""

from __future__ import annotations

import json

import optcli
from optcli.commands.graph import to_dot
from optcli.nb.reader import load_file
from tests.commands.conftest import cli


def test_text_shows_every_part_within_80_columns(gpu_model, capsys):
    code, out, err = cli(["inspect", str(gpu_model[1]), "--advise"], capsys)
    assert code == 0, err
    for part in ("format v1", "size by part:", "weights float32", "ops per target:", "conv2d_3x3",
                 "copies and layout conversions: 2 host<->device copies, 2 layout conversions",
                 "peak activation memory:", "advice"):
        assert part in out, part
    assert max(len(line) for line in out.splitlines()[1:]) <= 80  # the first line is the file's path


def test_json_is_complete_and_consistent(gpu_model, capsys):
    code, out, _ = cli(["inspect", str(gpu_model[1]), "--json", "--advise"], capsys)
    assert code == 0
    info = json.loads(out)
    sizes = info["sizes"]
    assert sizes["file_bytes"] == gpu_model[1].stat().st_size
    assert sum(sizes[k] for k in ("header_bytes", "body_bytes", "padding_bytes", "weights_bytes",
                                   "checksum_bytes")) == sizes["file_bytes"]
    assert info["inputs"][0] == {"name": "input", "dtype": "float32", "shape": [1, 3, 32, 32]}
    assert info["ops"]["Conv"] == {"opencl": 52}
    conv = next(s for s in info["steps"] if s["op"] == "Conv")
    assert conv["launches"] and all(isinstance(g, int) for g in conv["launches"][0]["global_size"])
    assert [c["op"] for c in info["copies"]] == ["Upload", "Pack", "Unpack", "Download"]
    assert info["memory"]["peak_activation_bytes"] <= info["memory"]["naive_activation_bytes"]
    assert {a["rule"] for a in info["advice"]} >= {"rgb_input"}


def test_dynamic_cpu_model(cpu_model, capsys):
    code, out, _ = cli(["inspect", str(cpu_model[1])], capsys)
    assert code == 0
    assert "copies and layout conversions: none" in out and "depends on the input shapes" in out


def test_graph_dot_colours_targets_and_draws_copies_as_edges(gpu_model, tmp_path, capsys, monkeypatch):
    dot = to_dot(load_file(gpu_model[1])[0])
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    assert "#9fd39f" in dot  # opencl colour
    assert 'label="Upload + Pack"' in dot and 'label="Unpack + Download"' in dot
    assert "upload_input" not in dot  # copies are edges, not boxes
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)  # no graphviz: a PNG falls back to .dot text
    code, out, err = cli(["inspect", str(gpu_model[1]), f"--graph={tmp_path}/g.png"], capsys)
    assert code == 0 and "not installed" in err and "--graph=FILE.svg draws without it" in err
    assert (tmp_path / "g.dot").read_text() == dot and not (tmp_path / "g.png").exists()


def test_graph_svg_without_graphviz_is_a_picture_naming_every_step(gpu_model, tmp_path, capsys, monkeypatch):
    """Issue 22: without graphviz, --graph=FILE.svg wrote only a .dot file; now our own layout draws it."""
    import xml.etree.ElementTree as ElementTree

    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)
    code, _, err = cli(["inspect", str(gpu_model[1]), f"--graph={tmp_path}/g.svg"], capsys)
    assert code == 0 and "not installed" not in err
    root = ElementTree.parse(tmp_path / "g.svg").getroot()  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    texts = {t.text for t in root.iter(f"{ns}text")}
    plan = load_file(gpu_model[1])[0]
    drawn = [s for s in plan.steps if not (s.domain == "optcli" and s.op_type in ("Upload", "Pack", "Unpack",
                                                                                   "Download"))]
    assert all(s.name in texts for s in drawn), "every step is named in the picture"
    assert "Upload + Pack" in texts and "Unpack + Download" in texts  # copies drawn as labelled edges
    fills = {r.get("fill") for r in root.iter(f"{ns}rect")}
    assert "#9fd39f" in fills and "#f4c99b" in fills  # opencl and arm colours
    assert len(list(root.iter(f"{ns}line"))) >= len(drawn)


def test_step_names_are_shown_in_full(tmp_path, capsys):
    """Issue 22: names cut to 18 characters made every block of a timm model read /blocks/blocks.0/~."""
    from onnx import TensorProto, helper

    long = [f"/blocks/blocks.{i}/conv_pwl/Conv_with_a_long_tail" for i in range(2)]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name=long[0]),
                               helper.make_node("Sigmoid", ["a"], ["y"], name=long[1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    nb = tmp_path / "m.nb"
    nb.write_bytes(optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                                   disabled_passes={"fuse_activation_patterns"}).data)
    code, out, _ = cli(["inspect", str(nb)], capsys)
    assert code == 0 and all(name in out for name in long)


def test_errors_exit_2_with_one_line(gpu_model, tmp_path, capsys):
    bad = tmp_path / "bad.nb"
    bad.write_bytes(b"not a model")
    for args in (["inspect", str(bad)], ["inspect", str(tmp_path / "missing.nb")],
                 ["inspect", str(gpu_model[1]), f"--graph={tmp_path}/g.jpg"]):
        code, _, err = cli(args, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
