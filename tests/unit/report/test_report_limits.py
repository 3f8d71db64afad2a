"""edgedeploy.report.limits and .tree: sizes, tolerances, project requirements, tree levels.

tests/data/report/run_u55_u85 is a run folder written by `edgedeploy compile` with Vela 5.2.0 (see its
SOURCE.md): the MLPerf DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
"""

from __future__ import annotations


import pytest

from edgedeploy.errors import UsageError
from edgedeploy.report import (
    DEFAULT_TOLERANCES,
    LEAF_LEVELS,
    Requirements,
    Tolerance,
    leaf_level,
    parse_size,
    parse_tolerances,
    requirements_from_project,
)


@pytest.mark.parametrize(
    "text, expected",
    [("123", 123), ("512KiB", 524288), ("2MiB", 2097152), ("1.5 MiB", 1572864), ("64kB", 64000), ("1MB", 10**6),
     ("0", 0), (4096, 4096), ("7b", 7), ("1gib", 1 << 30)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "12 apples", "-3", "1k", "KiB", "1.2.3MiB"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError, match="--max-flash is") as err:
        parse_size(text, "--max-flash")
    assert "512KiB" in err.value.one_line()


def test_parse_tolerances():
    assert parse_tolerances(None) == DEFAULT_TOLERANCES
    t = parse_tolerances("accuracy=0.25, flash=2KiB ,cycles=5%")
    assert t["accuracy"] == Tolerance(0.25, False)
    assert t["flash"] == Tolerance(2048, False)
    assert t["cycles"] == Tolerance(5.0, True) and t["sram"] == DEFAULT_TOLERANCES["sram"]
    assert t["cycles"].allowed(200_000) == 10_000
    for bad, msg in (("accuracy=1%", "percentage points"), ("speed=3%", "NAME=VALUE"), ("cycles", "NAME=VALUE"),
                     ("cycles=x", "not a number"), ("flash=-1%", "negative")):
        with pytest.raises(UsageError, match=msg):
            parse_tolerances(bad)


def test_tree_levels_table():
    assert [n for n, _ in sorted(LEAF_LEVELS.items(), key=lambda kv: kv[1]) if n != "ptq_16x8"][:2] == ["ptq", "qat"]
    assert leaf_level("ptq_16x8") == 0  # the baseline with int16 activations
    assert leaf_level("ptq") == 0 and leaf_level("qat") == 1
    assert leaf_level("pruned") == leaf_level("clustered") == 2
    assert leaf_level("pqat") == leaf_level("cqat") == leaf_level("pruned_clustered") == 3
    assert leaf_level("pcqat") == 4
    assert leaf_level("pcqat_palette") == 4 and leaf_level("pruned_ptq") == 2
    assert leaf_level("dscnn_mlperf") is None and leaf_level("foo_palette") is None


def test_project_requirements(tmp_path):
    p = tmp_path / "edgedeploy.toml"
    p.write_text('[model]\npath = "m.h5"\n\n[requirements]\nmax_accuracy_drop = 1\nmax_flash = "512KiB"\n'
                 "max_sram = 262144\nmax_latency_ms = 2.5\n")
    req = requirements_from_project(p)
    assert (req.max_accuracy_drop, req.max_flash, req.max_sram, req.max_latency_ms) == (1.0, 524288, 262144, 2.5)
    assert req.sources == (f"{p} [requirements]",)
    merged = Requirements(max_flash=1000, sources=("command line",)).over(req)
    assert merged.max_flash == 1000 and merged.max_sram == 262144 and merged.sources[0] == "command line"
    (tmp_path / "none.toml").write_text("[model]\n")
    assert requirements_from_project(tmp_path / "none.toml").given() == {}


@pytest.mark.parametrize(
    "body, match",
    [("[requirements]\nmax_flsh = 3\n", r"requirements\.max_flsh. is not known"),
     ("[requirements]\nmax_flash = \"lots\"\n", r"requirements\.max_flash"),
     ("[requirements]\nmax_latency_ms = \"fast\"\n", r"requirements\.max_latency_ms. is 'fast'"),
     ("requirements = 3\n", "must be a table"),
     ("[requirements\n", "not valid TOML")],
)
def test_project_requirements_errors(tmp_path, body, match):
    p = tmp_path / "edgedeploy.toml"
    p.write_text(body)
    with pytest.raises(UsageError, match=match) as err:
        requirements_from_project(p)
    assert str(p) in err.value.message


def test_every_face_takes_the_requirements_of_the_one_table():
    """The requirement names are written once (config.requirements.REQUIREMENTS): the Requirements fields, the
    project keys, the report checks, the API and notebook arguments and the command-line options all follow it."""
    import dataclasses
    import inspect

    from edgedeploy import api
    from edgedeploy.cli.optimize import optimize_cmd
    from edgedeploy.cli.report import report_cmd
    from edgedeploy.config.requirements import REQUIREMENT_NAMES
    from edgedeploy.interactive.optimize_run import OptimizeRun
    from edgedeploy.pipeline.project import PROJECT_KEYS
    from edgedeploy.report.judge import REQUIREMENT_VALUES

    names = list(REQUIREMENT_NAMES)
    assert [f.name for f in dataclasses.fields(Requirements) if f.name != "sources"] == names
    assert list(Requirements.KEYS) == list(REQUIREMENT_VALUES) == names
    assert [k.path.removeprefix("requirements.") for k in PROJECT_KEYS if k.path.startswith("requirements.")] == names
    for face in (api.requirements, OptimizeRun.report, report_cmd, optimize_cmd):
        assert sorted(p for p in inspect.signature(face).parameters if p.startswith("max_")) == sorted(names), face
