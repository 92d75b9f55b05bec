"""Real exporters' models (the corpus built by ``corpus/build.py``) through `opt` and the runtime.

For every model: `opt` succeeds on `arm` and on `opencl,arm`; outputs match onnxruntime (fp32
within 1e-3 of the output's scale, fp16 within 2e-2 or within 1.5x what half storage alone costs
onnxruntime on that model (corpus/fp16_reference.py), models quantized by onnxruntime 5e-2); no fold
failures; at most as many compute steps as onnxruntime keeps nodes after its extended
optimizations; and on vision models with a pinned input every conv-family step is on opencl
(loaded with ``require_gpu=True``, so a GPU step that fell back to the CPU fails the test).

By default the CI subset runs (``OPTCLI_CORPUS=all`` for every model).  Without a built corpus
these tests skip with the command that builds it, unless ``OPTCLI_REQUIRE_CORPUS=1`` (CI sets it),
where a missing corpus fails.
"""

from __future__ import annotations

import os

import pytest

from corpus.evaluate import corpus_dir, is_static_vision, load_manifest, ort_extended_nodes, require_corpus, run_model

SUBSET = os.environ.get("OPTCLI_CORPUS", "ci")
FOLDER = corpus_dir()
ENTRIES = [e for e in load_manifest(FOLDER) if SUBSET == "all" or SUBSET in e.get("subset", [])]

# Runs known to fail today, with why: {model: {run: reason}}, run being "arm", "opencl-fp32" or
# "opencl-fp16".  Strict: a run that starts passing fails the suite until its line is removed.
KNOWN_FAILURES: dict[str, dict[str, str]] = {}


def _expect(request, entry: dict, run: str) -> None:
    reason = KNOWN_FAILURES.get(entry["name"], {}).get(run)
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def test_corpus_is_built():
    require_corpus(bool(ENTRIES), f"corpus models for subset '{SUBSET}'")


@pytest.fixture(scope="module")
def references():
    """onnxruntime's outputs per model, computed once for all target sets."""
    from corpus.evaluate import feeds_for, ort_reference

    cache: dict[str, dict] = {}

    def get(entry):
        if entry["name"] not in cache:
            cache[entry["name"]] = ort_reference(FOLDER / entry["file"], feeds_for(entry))
        return cache[entry["name"]]

    return get


def _ids(entries):
    return [e["name"] for e in entries]


@pytest.mark.parametrize("entry", ENTRIES, ids=_ids(ENTRIES))
def test_on_the_host(entry, references, request):
    _expect(request, entry, "arm")
    run = run_model(entry, FOLDER, "arm", expected=references(entry))
    assert not run.error, run.error
    assert not run.fold_failures, run.fold_failures
    assert run.accurate, f"relative errors {run.errors} over {run.precision} tolerance"
    ort_nodes = ort_extended_nodes(FOLDER / entry["file"])
    assert run.compute_steps <= ort_nodes, f"{run.compute_steps} steps > onnxruntime's {ort_nodes} nodes"


@pytest.mark.opencl
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("entry", ENTRIES, ids=_ids(ENTRIES))
def test_on_opencl(entry, precision, references, request):
    _expect(request, entry, f"opencl-{precision}")
    run = run_model(entry, FOLDER, "opencl,arm", precision, gpu=True, expected=references(entry))
    assert not run.error, run.error
    assert run.accurate, f"relative errors {run.errors} over {run.precision} tolerance"
    if is_static_vision(entry):
        assert run.convs_placed, (f"{run.conv_steps - run.conv_on_gpu - run.conv_kept_on_host} of "
                                  f"{run.conv_steps} conv steps on the host without the cost model's reason")
