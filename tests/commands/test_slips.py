"""Small slips that cost trust (issue 22, part 7), each a message or an order of checks a new user
meets: an ONNX file handed to the runtime, a non-array given as an input, an output path through a
file, an output folder found unwritable only after the run, an empty label column, and bench's
headline ratio taken from minimums."""

from __future__ import annotations

import numpy as np

from tests.commands.conftest import cli


def test_an_onnx_file_given_to_run_says_optimize_it_first(cpu_model, capsys, tmp_path):
    onnx_path, _ = cpu_model
    code, _, err = cli(["run", str(onnx_path)], capsys)
    assert code == 2 and "this is an ONNX model, not an optcli .nb file; optimize it first: opt --model_file=" in err
    renamed = tmp_path / "model.bin"  # recognised by content too
    renamed.write_bytes(onnx_path.read_bytes())
    code, _, err = cli(["run", str(renamed)], capsys)
    assert code == 2 and "this is an ONNX model" in err


def test_a_non_array_input_says_so_without_numpys_pickle_hint(cpu_model, capsys):
    onnx_path, nb = cpu_model
    code, _, err = cli(["run", str(nb), "--input", f"input={onnx_path}"], capsys)
    assert code == 2 and "is not a readable .npy file (not a .npy array)" in err and "pickle" not in err


def test_an_output_path_through_a_file_names_the_file(cpu_model, capsys, tmp_path):
    from optcli.cli import opt_main
    from tests.helpers import run_cli

    onnx_path, _ = cpu_model
    (tmp_path / "afile").write_text("x")
    code, _, err = run_cli(opt_main, "opt", [f"--model_file={onnx_path}", f"--optimize_out={tmp_path}/afile/model"],
                           capsys)
    assert code == 2 and "afile is a file, not a folder" in err and "File exists" not in err


def test_an_unwritable_output_dir_is_refused_before_the_run(cpu_model, capsys, tmp_path, monkeypatch):
    from optcli.runtime.predictor import Predictor

    _, nb = cpu_model
    (tmp_path / "afile").write_text("x")
    ran = []
    real = Predictor.run
    monkeypatch.setattr(Predictor, "run", lambda self, *a, **k: ran.append(1) or real(self, *a, **k))
    code, _, err = cli(["run", str(nb), "--output_dir", str(tmp_path / "afile" / "out")], capsys)
    assert code == 2 and "--output_dir: cannot write" in err
    assert not ran, "the model must not run when its outputs cannot be saved"


def test_top_k_without_labels_has_no_label_column(gpu_model, capsys):
    _, nb = gpu_model
    code, out, _ = cli(["run", str(nb), "--input", f"input={nb.parent / 'x.npy'}", "--top_k", "3"], capsys)
    assert code == 0
    header = next(line for line in out.splitlines() if line.strip().startswith("batch"))
    assert "label" not in header and "class" in header and "prob" in header


def test_bench_headline_ratio_is_by_minimum(cpu_model, capsys):
    import json

    onnx_path, nb = cpu_model
    code, out, _ = cli(["bench", str(nb), "--runs", "5", "--warmup", "1", "--profile_runs", "0", "--compare_onnx",
                        str(onnx_path), "--input_shapes", "input:1,3,32,32", "--json"], capsys)
    assert code == 0
    r = json.loads(out)
    ort = r["onnxruntime"]
    assert np.isclose(ort["ratio"], r["min_ms"] / ort["min_ms"], rtol=0.01, atol=0.002)
    assert np.isclose(ort["ratio_median"], r["median_ms"] / ort["median_ms"], rtol=0.01, atol=0.002)
