"""`edgedeploy report` on run folders compiled here with real Vela.

Two session run folders:

- ``plain_run``: the MLPerf DS-CNN and ResNet-8 int8 models compiled for four targets (imported
  variants, no accuracy).
- ``tree_run``: a copy of a real compile run whose variants carry leaf names, with convert-style
  records added. The accuracies in TREE_ACCURACY are inputs stated by this test (no model was
  evaluated); every Vela number comes from real Vela runs on the real models.
"""

from __future__ import annotations

import csv
import gzip
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_in_process

from edgedeploy.pipeline.compile import compile_tflite
from edgedeploy.core.manifest import Artifact, Manifest, Metric, StageRecord, now_iso
from edgedeploy.report import ALL_COLUMNS, Requirements, build_report
from edgedeploy.report.plot_inputs import weight_stages
from edgedeploy.report.render import render

pytestmark = pytest.mark.requires_data
# plain_run and tree_run compile the MLPerf ResNet-8 beside the DS-CNN
NEEDS_IC = pytest.mark.requires_data("ic/resnet8_mlperf_int8.tflite")

TARGETS = ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256", "corstone-300-u55-128"]
EDGEDEPLOY = [sys.executable, "-m", "edgedeploy"]

# Test inputs: which real model each leaf name stands for, and the accuracies this test states for it.
TREE_MODELS = {
    "ptq": "ic/resnet8_mlperf_int8.tflite",
    "qat": "ic/resnet8_mlperf_int8.tflite",
    "pruned": "kws/dscnn_mlperf_int8.tflite",
    "clustered": "kws/dscnn_mlperf_int8.tflite",
    "pcqat": "kws/dscnn_mlperf_int8.tflite",
}
TREE_ACCURACY = {  # leaf: (float accuracy %, int8 accuracy %), stated by this test
    "ptq": (86.4, 86.0),
    "qat": (86.4, 86.3),
    "pruned": (85.5, 84.9),
    "clustered": (85.6, 85.2),
    "pcqat": (85.0, 85.5),
}


@pytest.fixture(scope="session")
def plain_run(shared_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plain") / "run"
    compile_tflite([shared_data / "kws" / "dscnn_mlperf_int8.tflite", shared_data / "ic" / "resnet8_mlperf_int8.tflite"],
                   TARGETS, out)
    return out


@pytest.fixture(scope="session")
def tree_source_run(shared_data, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("tree-src")
    models = []
    for leaf, rel in TREE_MODELS.items():
        dst = base / f"{leaf}_int8.tflite"
        shutil.copyfile(shared_data / rel, dst)
        models.append(dst)
    out = base / "run"
    compile_tflite(models, TARGETS, out)
    return out


def add_convert_record(manifest: Manifest, leaf: str, model: Path, float_acc: float, int8_acc: float) -> None:
    """A convert-style record with the accuracies stated by the test and the real model's sizes."""
    dest = manifest.run_dir / "convert" / leaf / "model_int8.tflite"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, dest)
    data = dest.read_bytes()
    manifest.records[f"convert/{leaf}"] = StageRecord(
        id=f"convert/{leaf}", stage="convert", status="ok", variant=leaf,
        outputs=[Artifact.of("int8_model", dest, manifest.run_dir)],
        metrics={
            "float_accuracy": Metric(float_acc, "%", "measured"),
            "int8_accuracy": Metric(int8_acc, "%", "measured"),
            "tflite_bytes": Metric(len(data), "B", "measured"),
            "gzip_bytes": Metric(len(gzip.compress(data)), "B", "measured"),
        },
        details={"test_input": "accuracies stated by tests/integration/report/test_report_integration.py"},
        started=now_iso(),
    )


@pytest.fixture(scope="session")
def tree_run(tree_source_run, shared_data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("tree") / "run"
    shutil.copytree(tree_source_run, run)
    manifest = Manifest.load(run)
    for leaf, (fa, ia) in TREE_ACCURACY.items():
        add_convert_record(manifest, leaf, manifest.run_dir / "import" / leaf / "model_int8.tflite", fa, ia)
    # The real float Keras DS-CNN as the tree's baseline node (for the weights-through-the-stages plot).
    base = run / "optimize" / "baseline" / "model.h5"
    base.parent.mkdir(parents=True)
    shutil.copyfile(shared_data / "kws" / "dscnn_mlperf_float.h5", base)
    manifest.records["optimize/baseline"] = StageRecord(
        id="optimize/baseline", stage="optimize", status="ok", variant="baseline",
        outputs=[Artifact.of("keras_model", base, run)], started=now_iso())
    manifest.save()
    return run


def vela_summary(manifest: Manifest, row: dict) -> dict:
    rec = manifest.records[row["stages"]["compile"]]
    path = manifest.resolve(rec.output("summary_csv"))
    with open(path, newline="") as fh:
        (line,) = list(csv.DictReader(fh))
    return {k.strip(): v for k, v in line.items()}


# --------------------------------------------------------------------------- numbers


@NEEDS_IC
@pytest.mark.parametrize("which", ["plain_run", "tree_run"])
def test_numbers_equal_velas_own_csv(which, request):
    run = request.getfixturevalue(which)
    doc = json.loads(run_in_process("report", run, "--format", "json").stdout)
    manifest = Manifest.load(run)
    compiled = [r for r in doc["rows"] if r["target"]]
    assert len(compiled) == len(TARGETS) * len({r["leaf"] for r in doc["rows"]})
    for row in compiled:
        v = {k: c["value"] for k, c in row["values"].items()}
        s = vela_summary(manifest, row)
        f = {k: float(x) for k, x in s.items() if re.fullmatch(r"-?[\d.]+(e-?\d+)?", x)}
        assert v["vela_flash_bytes"] == round((f["on_chip_flash_memory_used"] + f["off_chip_flash_memory_used"]) * 1024)
        assert v["sram_bytes"] == round(f["sram_memory_used"] * 1024)
        assert v["dram_bytes"] == round(f["dram_memory_used"] * 1024)
        assert v["encoded_weights_bytes"] == f["total_npu_encoded_weights"]
        assert v["npu_cycles"] == f["cycles_npu"] and v["total_cycles"] == f["cycles_total"]
        target = doc["targets"][row["target"]]
        assert v["npu_clock_mhz"] * 1e6 == target["npu_hz"] == f["core_clock"]
        assert v["latency_ms"] == pytest.approx(f["inference_time"] * 1e3, rel=1e-3)
        assert v["inferences_per_s"] == pytest.approx(f["inferences_per_second"], rel=1e-3)
        macs_per_cycle = int(target["accelerator_config"].rsplit("-", 1)[1])
        assert v["mac_utilization_pct"] == pytest.approx(100 * f["nn_macs"] / (f["cycles_total"] * macs_per_cycle))
        vela_model = manifest.resolve(manifest.records[row["stages"]["compile"]].output("vela_model"))
        assert v["compiled_model_bytes"] == vela_model.stat().st_size
        assert v["cpu_operators"] == 0


def _num(text: str) -> float:
    return float(text.replace(",", "").split(" [")[0])


def _close(shown: str, value, kind: str) -> None:
    """A displayed number agrees with the JSON value to the precision it is shown with."""
    if value is None:
        assert shown.startswith("n/a"), shown
        return
    digits = len(shown.split(".")[1]) if "." in shown else 0
    assert abs(_num(shown) - value) <= 0.5 * 10**-digits + 1e-9, (shown, value, kind)


class _Tables(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables, self.row, self.cell, self.imgs = [], None, None, []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th"):
            self.cell = ""
        elif tag == "img":
            self.imgs.append(dict(attrs))

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.row.append(self.cell)
            self.cell = None
        elif tag == "tr":
            self.tables[-1].append(self.row)

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


FORMATS = ("json", "csv", "markdown", "html", "table")


@pytest.fixture(scope="module")
def written(request, tmp_path_factory):
    """``written(which)``: the folder holding run ``which``'s report in every format (``r.FORMAT``), each written
    once by `edgedeploy report --format FORMAT --out`; the tests that read a report (the HTML page is the slow one:
    its plots) share them."""
    folders: dict[str, Path] = {}

    def get(which: str) -> Path:
        if which not in folders:
            run = request.getfixturevalue(which)
            folder = tmp_path_factory.mktemp(f"{which}-reports")
            for fmt in FORMATS:
                proc = run_in_process("report", run, "--format", fmt, "--out", folder / f"r.{fmt}")
                assert proc.returncode == 0, proc.stderr
            folders[which] = folder
        return folders[which]

    return get


@NEEDS_IC
@pytest.mark.parametrize("which", ["plain_run", "tree_run"])
def test_all_formats_agree(which, written):
    outs = {fmt: (written(which) / f"r.{fmt}").read_text(encoding="utf-8") for fmt in FORMATS}
    doc = json.loads(outs["json"])
    assert doc["schema"] == "edgedeploy.report" and doc["schema_version"] == 1
    cols = doc["columns"]
    value_keys = [c["key"] for c in cols if c["key"] in doc["rows"][0]["values"]]
    kinds = {c.key: c.kind for c in ALL_COLUMNS}
    # CSV: the raw numbers of the JSON.
    csv_rows = list(csv.DictReader(outs["csv"].splitlines()))
    assert len(csv_rows) == len(doc["rows"])
    for row, line in zip(doc["rows"], csv_rows):
        assert (line["leaf"], line["target"] or None) == (row["leaf"], row["target"])
        for k in value_keys:
            v = row["values"][k]["value"]
            assert (line[k] == "") if v is None else float(line[k]) == float(v), (k, line[k], v)
    # Markdown and HTML: the same table, numbers rounded as shown.
    md = [l for l in outs["markdown"].splitlines() if l.startswith("| ")]
    md_header = [c.strip() for c in md[0].strip("|").split(" | ")]
    assert md_header == [c["header"] for c in cols]
    parser = _Tables()
    parser.feed(outs["html"])
    html_rows = parser.tables[0]
    assert html_rows[0] == md_header
    for i, row in enumerate(doc["rows"]):
        md_cells = [c.strip() for c in md[1 + i].strip("|").split(" | ")]
        assert md_cells == [c.strip() for c in html_rows[1 + i]]
        for j, k in enumerate(c["key"] for c in cols):
            if k in value_keys:
                _close(md_cells[j], row["values"][k]["value"], kinds[k])
        judged = dict(zip([c["key"] for c in cols], md_cells))
        assert judged["recommended"] == ("yes" if row["recommended"] else "")
        assert judged["pareto"] == {True: "yes", False: "no", None: "n/a"}[row["pareto"]]
        assert (judged["fits_board"] == "n/a") == (not row["fit"]["applies"])
    # Terminal table: every compiled row's cycles and flash appear, as shown elsewhere.
    for row in doc["rows"]:
        if row["target"]:
            for k in ("total_cycles", "compiled_model_bytes", "sram_bytes"):
                assert f"{row['values'][k]['value']:,}" in outs["table"]
    for target, rec in doc["recommendations"].items():
        assert rec["message"] in outs["markdown"]
        if rec["leaf"]:
            assert f"{target}: recommend {rec['leaf']}" in outs["table"]


@NEEDS_IC
def test_imported_variants_say_why_accuracy_is_unavailable(plain_run):
    proc = run_in_process("report", plain_run)
    assert proc.returncode == 0, proc.stderr
    assert "unavailable: no accuracy: dscnn_mlperf was imported from a .tflite" in proc.stdout
    doc = build_report(plain_run)
    row = doc["rows"][0]
    assert row["values"]["int8_accuracy_pct"]["value"] is None
    assert "imported" in row["values"]["int8_accuracy_pct"]["unavailable"]
    # Without any accuracy the Pareto front is over flash and cycles, per target: DS-CNN is smaller and faster.
    for t in TARGETS:
        assert doc["pareto"][t]["front"] == ["dscnn_mlperf"]
        assert "no leaf has a measured accuracy" in doc["pareto"][t]["note"]


@NEEDS_IC
def test_board_fit_states_margin_and_uses_board_memory(plain_run):
    doc = build_report(plain_run)
    board = doc["targets"]["corstone-300-u55-128"]["memory"]
    for row in doc["rows"]:
        fit = row["fit"]
        if row["target"] == "corstone-300-u55-128":
            sram = row["values"]["sram_bytes"]["value"]
            assert fit["applies"] and fit["runtime_margin_bytes"] == board["runtime_margin_bytes"] == 16384
            assert fit["fits"] == (sram + 16384 <= board["sram_bytes"]
                                   and row["values"]["compiled_model_bytes"]["value"] <= board["flash_bytes"])
            assert "16,384 B runtime margin" in fit["note"]
        else:
            assert not fit["applies"] and row["fit"]["text"] == "n/a"


def test_small_board_does_not_fit(shared_data, tmp_path):
    """A user's board file with 32 KiB of SRAM: DS-CNN needs 22,192 B + the 16,384 B margin, so it does not fit."""
    src = Path(__file__).resolve().parents[3] / "targets" / "corstone-300-u55-128.toml"
    text = src.read_text().replace('name = "corstone-300-u55-128"', 'name = "tiny-board"')
    text = text.replace("sram_bytes = 2_097_152", "sram_bytes = 32_768")
    board = tmp_path / "tiny-board.toml"
    board.write_text(text)
    run = tmp_path / "run"
    compile_tflite([shared_data / "kws" / "dscnn_mlperf_int8.tflite"], [str(board)], run)
    proc = run_in_process("report", run, "--format", "json")
    assert proc.returncode == 8, proc.stderr  # nothing fits the board
    doc = json.loads(proc.stdout)  # the report is still written
    (row,) = doc["rows"]
    sram = row["values"]["sram_bytes"]["value"]
    assert row["fit"]["fits"] is False
    assert f"exceeds 32,768 B by {sram + 16384 - 32768:,} B" in row["fit"]["note"]
    assert "does not fit" in proc.stderr and "tiny-board" in proc.stderr


# --------------------------------------------------------------------------- recommendation


def _flash(doc, leaf, target):
    row = next(r for r in doc["rows"] if r["leaf"] == leaf and r["target"] == target)
    return row["values"]["compiled_model_bytes"]["value"]


@NEEDS_IC
def test_no_requirements_recommends_least_optimized_leaf_no_other_beats(tree_run):
    doc = build_report(tree_run)
    for t in TARGETS:
        # qat is the same real model as ptq, 0.3 points more accurate: it beats ptq on every axis
        assert doc["recommendations"][t]["leaf"] == "qat"
        assert doc["recommendations"][t]["passed_over"] == {"ptq": "qat"}
    assert doc["reference_leaf"] == "ptq"
    qat = next(r for r in doc["rows"] if r["leaf"] == "qat" and r["target"] == "ethos-u55-128")
    assert qat["values"]["int8_accuracy_delta_pts"]["value"] == pytest.approx(86.3 - 86.0)
    assert qat["values"]["encoded_weights_ratio"]["value"] == pytest.approx(1.0)  # the same real model as ptq
    pcqat = next(r for r in doc["rows"] if r["leaf"] == "pcqat" and r["target"] == "ethos-u55-128")
    ptq = next(r for r in doc["rows"] if r["leaf"] == "ptq" and r["target"] == "ethos-u55-128")
    assert pcqat["values"]["encoded_weights_ratio"]["value"] == pytest.approx(
        pcqat["values"]["encoded_weights_bytes"]["value"] / ptq["values"]["encoded_weights_bytes"]["value"])


@NEEDS_IC
def test_flash_limit_rules_out_level_zero_and_one_and_skips_beaten_leaves(tree_run):
    base = build_report(tree_run)
    t = "ethos-u55-128"
    small, large = _flash(base, "pruned", t), _flash(base, "ptq", t)
    assert small < large
    doc = build_report(tree_run, Requirements(max_flash=(small + large) // 2))
    rec = doc["recommendations"][t]
    # ptq and qat are too big; pruned, clustered and pcqat are the same real model (same flash and cycles) and
    # pcqat is the most accurate: it beats the level-2 leaves on every axis.
    assert rec["leaf"] == "pcqat" and rec["level"] == 4
    assert rec["passed_over"] == {"pruned": "clustered", "clustered": "pcqat"}
    assert "clustered (beaten by pcqat)" in rec["message"]
    # Int8 accuracy drops below ptq (86.0): clustered 0.8, pruned 1.1, pcqat 0.5.
    doc = build_report(tree_run, Requirements(max_flash=(small + large) // 2, max_accuracy_drop=1.0))
    assert doc["recommendations"][t]["leaf"] == "pcqat"
    doc = build_report(tree_run, Requirements(max_flash=(small + large) // 2, max_accuracy_drop=0.6))
    rec = doc["recommendations"][t]
    assert rec["leaf"] == "pcqat" and rec["level"] == 4
    pruned = next(r for r in doc["rows"] if r["leaf"] == "pruned" and r["target"] == t)
    assert pruned["requirements"]["max_accuracy_drop"]["met"] is False
    assert pruned["requirements"]["max_accuracy_drop"]["excess"] == pytest.approx(1.1 - 0.6)
    assert pruned["meets_requirements"] is False and pruned["requirements"]["max_flash"]["met"] is True


@NEEDS_IC
def test_nothing_meets_says_which_requirement_and_by_how_much(tree_run, tmp_path):
    doc = build_report(tree_run)
    t = "ethos-u85-256"
    smallest = min(_flash(doc, leaf, t) for leaf in TREE_MODELS)
    proc = run_in_process("report", tree_run, "--max-flash", "1KiB", "--format", "json")
    assert proc.returncode == 8
    out = json.loads(proc.stdout)
    rec = out["recommendations"][t]
    assert rec["leaf"] is None
    (unmet,) = rec["unmet"]
    assert unmet["requirement"] == "max_flash" and unmet["limit"] == 1024
    assert unmet["excess"] == smallest - 1024
    # Among the equally small DS-CNN leaves the closest is the most accurate one.
    assert unmet["closest_leaf"] == "pcqat"
    assert f"over by {smallest - 1024:,} B" in proc.stderr


@NEEDS_IC
def test_each_requirement_met_somewhere_but_not_together(tree_run):
    base = build_report(tree_run)
    t = "ethos-u55-128"
    limit = (_flash(base, "pruned", t) + _flash(base, "ptq", t)) // 2
    # Only ptq and qat (drop 0, -0.3) meet 0.45 points; only the DS-CNN leaves meet the flash limit.
    doc = build_report(tree_run, Requirements(max_flash=limit, max_accuracy_drop=0.45))
    rec = doc["recommendations"][t]
    assert rec["leaf"] is None and rec["unmet"] == []
    assert "no leaf meets all of them" in rec["message"]
    # pcqat misses the accuracy limit by 0.05 of 0.45 points; qat misses the flash limit by far more.
    assert rec["closest_leaf"] == "pcqat"
    assert any("max_accuracy_drop" in m for m in rec["closest_misses"])


@NEEDS_IC
def test_project_file_requirements_and_cli_precedence(tree_run, tmp_path, monkeypatch):
    base = build_report(tree_run)
    t = "ethos-u55-128"
    limit = (_flash(base, "pruned", t) + _flash(base, "ptq", t)) // 2
    (tmp_path / "edgedeploy.toml").write_text(f'[requirements]\nmax_flash = "{limit / 1024:.3f}KiB"\n')
    proc = run_in_process("report", tree_run, "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["recommendations"][t]["leaf"] == "pcqat"
    assert any("edgedeploy.toml" in s for s in doc["requirements"]["sources"])
    proc = run_in_process("report", tree_run, "--format", "json", "--max-flash", "10MiB", cwd=tmp_path)
    assert json.loads(proc.stdout)["recommendations"][t]["leaf"] == "qat"  # the command line wins


# --------------------------------------------------------------------------- regression gate


@NEEDS_IC
def test_regression_gate(plain_run, tmp_path):
    ref = tmp_path / "old.json"
    assert run_in_process("report", plain_run, "--format", "json", "--out", ref).returncode == 0
    same = run_in_process("report", plain_run, "--compare", ref, "--fail-on-regression")
    assert same.returncode == 0, same.stderr
    assert "no regression" in same.stdout
    # A reference in which DS-CNN on U55 was 10% faster and ResNet-8 used less SRAM: now it looks worse.
    old = json.loads(ref.read_text())
    for row in old["rows"]:
        if row["leaf"] == "dscnn_mlperf" and row["target"] == "ethos-u55-128":
            row["values"]["total_cycles"]["value"] = int(row["values"]["total_cycles"]["value"] * 0.9)
        if row["leaf"] == "resnet8_mlperf" and row["target"] == "ethos-u85-256":
            row["values"]["sram_bytes"]["value"] -= 4096
    doctored = tmp_path / "doctored.json"
    doctored.write_text(json.dumps(old))
    worse = run_in_process("report", plain_run, "--compare", doctored, "--fail-on-regression", "--format", "json")
    assert worse.returncode == 10, worse.stderr
    comp = json.loads(worse.stdout)["comparison"]
    assert not comp["passed"]
    assert {(r["leaf"], r["target"], r["metric"]) for r in comp["regressions"]} == {
        ("dscnn_mlperf", "ethos-u55-128", "cycles"), ("resnet8_mlperf", "ethos-u85-256", "sram")}
    assert "2 regression(s)" in worse.stderr and "total cycles" in worse.stderr
    # A wide enough tolerance accepts both changes; without --fail-on-regression it only reports.
    ok = run_in_process("report", plain_run, "--compare", doctored, "--fail-on-regression", "--tolerance",
                 "cycles=12%,sram=8KiB")
    assert ok.returncode == 0, ok.stderr
    info = run_in_process("report", plain_run, "--compare", doctored)
    assert info.returncode == 0 and "REGRESSION" in info.stdout


# --------------------------------------------------------------------------- compression diagnostics


@NEEDS_IC
def test_clustering_that_did_not_survive_is_flagged(tree_run):
    doc = build_report(tree_run)
    comp = doc["compression"]
    # "clustered" here is the unclustered MLPerf DS-CNN: its int8 tensors have far more than 32 values.
    assert comp["clustered"]["status"] == "lost"
    assert "did not survive" in comp["clustered"]["note"]
    assert comp["pruned"]["status"] == "not clustered"
    conv1 = next(t for t in comp["pruned"]["tensors"] if t["tensor"] == "functional_1/conv2d_1/Conv2D")
    assert conv1["shape"] == [64, 1, 1, 64] and conv1["output_channels"] == 64
    assert 32 < conv1["max_distinct_per_channel"] <= conv1["distinct_values"] <= 256


@NEEDS_IC
def test_weights_through_the_stages(tree_run):
    import numpy as np

    stages, layer, why = weight_stages(Manifest.load(tree_run))
    assert why is None and layer == "conv2d_1"  # the first of the largest kernels of the float DS-CNN
    labels = [s[0] for s in stages]
    assert labels[0] == "baseline (float)" and labels[-1].startswith("int8 of pcqat")
    base, int8 = stages[0][1], stages[-1][1]
    assert base.size == int8.size == 64 * 64
    # The MLPerf int8 DS-CNN is a quantization of the same network: its conv2d_1 weights come from a float
    # model with the same layer; the dequantized values have the same spread to within 2x.
    assert 0.5 < np.std(int8) / np.std(base) < 2.0


# --------------------------------------------------------------------------- HTML in a real browser


@NEEDS_IC
def test_html_renders_in_headless_chromium(written, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium) to render the HTML report")
    page = written("tree_run") / "r.html"
    text = page.read_text(encoding="utf-8")
    parser = _Tables()
    parser.feed(text)
    assert len(parser.imgs) >= 5
    assert all(img["src"].startswith("data:image/png;base64,") for img in parser.imgs)
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", text)  # nothing fetched from a network
    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1400,6000",
         page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    from PIL import Image

    import numpy as np

    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape[:2] == (6000, 1400)  # tall enough for the whole report, plots included
    assert shot.stat().st_size > 50_000
    assert img.std() > 20  # not a blank page
    # Some plot pixels are coloured (matplotlib's tab:blue points and bars), not only black text on white.
    blue = (abs(img[..., 0].astype(int) - 31) < 30) & (abs(img[..., 1].astype(int) - 119) < 30) & (img[..., 2] > 150)
    assert blue.sum() > 500
    keep = os.environ.get("EDGEDEPLOY_KEEP_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)


@NEEDS_IC
def test_json_report_is_deterministic_apart_from_time(tree_run, written):
    a, b = build_report(tree_run), build_report(tree_run)
    assert {**a, "created": None} == {**b, "created": None}
    assert render(a, "csv") == render(b, "csv")
    assert "<img" in (written("tree_run") / "r.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- a model clustered with TFMOT


@pytest.fixture(scope="session")
def tfmot_clustered_int8(shared_data, tmp_path_factory) -> Path:
    """The float DS-CNN clustered to 16 centroids per kernel with TFMOT, then converted to int8 (per channel)."""
    import numpy as np

    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import function_converter

    env = tfenv.load()
    tf, keras, cl = env.tf, env.keras, env.tfmot.clustering.keras
    keras.utils.set_random_seed(0)
    model = keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    clustered = cl.strip_clustering(cl.cluster_weights(
        model, number_of_clusters=16, cluster_centroids_init=cl.CentroidInitialization.KMEANS_PLUS_PLUS))
    data = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz")
    fit = np.where(data["split"] == 0)[0]  # a seeded random choice: the file is sorted by class
    calib = data["x"][np.random.default_rng(0).choice(fit, 64, replace=False)].astype("float32")
    converter = function_converter(clustered)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([calib[i : i + 1]] for i in range(len(calib)))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    path = tmp_path_factory.mktemp("clustered") / "clustered_int8.tflite"
    path.write_bytes(converter.convert())
    return path


def test_tfmot_clustering_survives_per_channel_but_not_per_tensor(tfmot_clustered_int8, shared_data, tmp_path):
    """Per-channel scales and folded batch norms spread 16 clusters over many int8 values per tensor."""
    run = tmp_path / "run"
    compile_tflite([tfmot_clustered_int8, shared_data / "kws" / "dscnn_mlperf_int8.tflite"], ["ethos-u55-128"], run)
    doc = build_report(run)
    comp = doc["compression"]["clustered"]
    assert comp["clustered_leaf"] and comp["weight_tensors"] == 10
    # Every output channel of the conv and dense kernels keeps at most 16 values (its clusters) ...
    convs = [t for t in comp["tensors"] if t["op"] in ("CONV_2D", "FULLY_CONNECTED")]
    assert convs and all(t["max_distinct_per_channel"] <= 16 for t in convs)
    # ... but the tensors hold more than Vela's 32-entry palette, so the leaf is flagged.
    assert comp["max_distinct_values"] > 32 and comp["status"] == "lost" and comp["survives_per_channel"]
    assert "did not survive" in comp["note"]
    assert doc["compression"]["dscnn_mlperf"]["status"] == "not clustered"
    # Vela still encodes the clustered weights somewhat smaller than the unclustered MLPerf model's.
    enc = {r["leaf"]: r["values"]["encoded_weights_bytes"]["value"] for r in doc["rows"]}
    assert enc["clustered"] < enc["dscnn_mlperf"]
