"""Our per-op shape functions against onnx's shape inference (issue 12).

Over every ONNX backend node test model (with its small numeric inputs given by value, and as
declared), every zoo model and every corpus model that is built: wherever onnx's strict inference
(with data propagation) gives a dim as a number, ours gives the same, and ours never contradicts
a node test's real output shapes; a valid model is never refused.  The other direction: each
float input's last dim (and dim 1) grown by one, where onnx's strict inference then refuses a
node whose op has a shape function here, ours refuses it too.  Ops with no shape function run
through the reference fallback: their outputs are unknown to the derivation, and they are left
out of both comparisons (listed nowhere, as no exception is needed for any op we have).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

from optcli.zoo.models import ZOO, build
from tests.ops.shape_differential import compare_model, rejections, with_values


def _node_cases():
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow/divide by zero on purpose
        return [c for c in node.collect_testcases() if c.kind == "node"]


def _feeds_and_outputs(case) -> tuple[dict, dict]:
    if not case.data_sets:
        return {}, {}
    ins, outs = case.data_sets[0]
    arrays = (np.ndarray, np.generic)
    feeds = {vi.name: np.asarray(v) for vi, v in zip(case.model.graph.input, ins) if isinstance(v, arrays)}
    expected = {vi.name: tuple(np.shape(v)) for vi, v in zip(case.model.graph.output, outs) if isinstance(v, arrays)}
    return feeds, expected


@pytest.fixture(scope="module")
def node_cases():
    return _node_cases()


def test_node_test_models_derive_as_onnx_and_the_real_outputs(node_cases):
    problems = []
    for case in node_cases:
        feeds, expected = _feeds_and_outputs(case)
        for model, how in ((with_values(case.model, feeds), "inputs by value"), (case.model, "inputs declared")):
            problems += [f"{case.name} ({how}): {p}" for p in compare_model(model, expected)]
    assert len(node_cases) > 1000
    assert not problems, "\n".join(problems[:40])


def test_node_test_models_made_inconsistent_are_refused_as_onnx_refuses_them(node_cases):
    refused, missed = 0, []
    for case in node_cases:
        feeds, _ = _feeds_and_outputs(case)
        both, mine = rejections(with_values(case.model, feeds))
        refused += both
        missed += [f"{case.name}: {m}" for m in mine]
    assert not missed, "\n".join(missed[:40])
    assert refused > 400  # the perturbations do reach the checks (591 when this was written)


def _models():
    from corpus.evaluate import corpus_dir, load_manifest

    models = [(name, lambda name=name: build(name)) for name in sorted(ZOO)]
    folder = corpus_dir()
    for entry in load_manifest(folder):
        path = folder / entry["file"]
        if path.exists():
            models.append((entry["name"], lambda path=path: onnx.load(str(path))))
    return models


@pytest.mark.parametrize("name,make", _models(), ids=[n for n, _ in _models()])
def test_zoo_and_corpus_models_derive_as_onnx(name, make):
    assert compare_model(make()) == []
