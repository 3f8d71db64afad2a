"""Every built-in target loads and validates; bad target files name the file, key and allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.errors import TargetError
from edgedeploy.config.targets import (
    ACCELERATOR_CONFIGS,
    builtin_target_names,
    get_target,
    list_targets,
    load_target_file,
)

BOARDS = {"corstone-300-u55-128", "corstone-300-u65-256", "corstone-310-u55-256", "corstone-320-u85-256"}


def test_every_vela_accelerator_config_has_a_target_file():
    names = set(builtin_target_names())
    assert set(ACCELERATOR_CONFIGS) <= names
    assert BOARDS <= names


@pytest.mark.parametrize("name", builtin_target_names())
def test_builtin_target_loads_and_validates(name):
    t = get_target(name)
    assert t.name == name
    assert t.vela_ini_path().is_file()
    assert len(t.vela_ini_sha256()) == 64
    assert t.npu_hz > 0
    assert t.macs_per_cycle == int(t.accelerator_config.rsplit("-", 1)[1])
    if t.kind == "board":
        assert t.memory is not None and t.memory.sram_bytes > 0 and t.memory.flash_bytes > 0
        assert t.fvp is not None and t.fvp.binary.startswith("FVP_Corstone_SSE-")
        assert t.cpu_core
    else:
        assert t.memory is None and t.fvp is None
    d = t.to_dict()
    assert d["vela"]["config_sha256"] == t.vela_ini_sha256()


def test_npu_clock_matches_the_vela_system_config():
    import configparser

    for t in list_targets():
        ini = configparser.ConfigParser()
        ini.read(t.vela_ini_path())
        assert float(ini[f"System_Config.{t.vela.system_config}"]["core_clock"]) == t.npu_hz, t.name


def test_corstone_320_uses_mps4_parameters_and_others_mps3():
    for name in BOARDS:
        t = get_target(name)
        params = dict(t.fvp.params)
        prefix = "mps4_board" if "320" in name else "mps3_board"
        assert all(k.startswith((prefix, "vis_hdlcd")) for k in params), name
        assert params[f"{prefix}.uart0.out_file"] == "-"
        assert params[f"{prefix}.telnetterminal0.start_telnet"] == "0"


def test_unknown_target_lists_valid_ones():
    with pytest.raises(TargetError) as err:
        get_target("ethos-u55-129")
    text = err.value.one_line()
    assert "unknown target 'ethos-u55-129'" in text
    assert "did you mean ethos-u55-128" in text
    assert "corstone-320-u85-256" in text


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "my-board.toml"
    path.write_text(body)
    return path


GOOD = """
schema_version = 1
name = "my-board"
kind = "npu"
[npu]
accelerator_config = "ethos-u55-64"
[vela]
config = "Arm/vela.ini"
system_config = "Ethos_U55_Deep_Embedded"
memory_mode = "Shared_Sram"
[clocks]
npu_hz = 200_000_000
"""


def test_user_target_file_by_path(tmp_path):
    t = get_target(str(_write(tmp_path, GOOD)))
    assert t.name == "my-board" and t.macs_per_cycle == 64 and t.npu_family == "ethos-u55"


@pytest.mark.parametrize(
    "old,new,expect",
    [
        ('accelerator_config = "ethos-u55-64"', 'accelerator_config = "ethos-u55-96"', "`npu.accelerator_config` is 'ethos-u55-96'; allowed values: ethos-u55-32"),
        ('kind = "npu"', 'kind = "chip"', "`kind` is 'chip'; allowed values: npu, board"),
        ("npu_hz = 200_000_000", "npu_hz = -5", "`clocks.npu_hz` is -5; it must be an integer >= 1"),
        ("npu_hz = 200_000_000", 'npu_hz = "fast"', "`clocks.npu_hz` is 'fast'"),
        ('system_config = "Ethos_U55_Deep_Embedded"', 'system_config = "Ethos_U55_Ultra"', "`vela.system_config` is 'Ethos_U55_Ultra'; allowed values in vela.ini: Ethos_U55_Deep_Embedded"),
        ('memory_mode = "Shared_Sram"', 'memory_mode = "Shared"', "`vela.memory_mode` is 'Shared'; allowed values in vela.ini: Dedicated_Sram"),
        ('config = "Arm/vela.ini"', 'config = "nowhere.ini"', "`vela.config` names 'nowhere.ini'"),
        ("schema_version = 1", "schema_version = 7", "`schema_version` is 7; allowed values: 1"),
        ('kind = "npu"', 'kind = "board"', "`cpu.core` is missing"),
    ],
)
def test_bad_value_names_file_key_and_allowed_values(tmp_path, old, new, expect):
    path = _write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(TargetError) as err:
        load_target_file(path)
    msg = err.value.one_line()
    assert str(path.resolve()) in msg
    assert expect in msg


def test_invalid_toml_syntax(tmp_path):
    path = _write(tmp_path, "name = [unclosed")
    with pytest.raises(TargetError, match="not valid TOML"):
        load_target_file(path)


def test_user_vela_ini_beside_the_target(tmp_path):
    (tmp_path / "board.ini").write_text(
        "[System_Config.My_Sys]\ncore_clock=100e6\naxi0_port=Sram\naxi1_port=OffChipFlash\n"
        "[Memory_Mode.My_Mode]\nconst_mem_area=Axi1\narena_mem_area=Axi0\ncache_mem_area=Axi0\n"
    )
    body = GOOD.replace('"Arm/vela.ini"', '"board.ini"').replace("Ethos_U55_Deep_Embedded", "My_Sys")
    t = load_target_file(_write(tmp_path, body.replace('"Shared_Sram"', '"My_Mode"')))
    assert t.vela_ini_path() == (tmp_path / "board.ini").resolve()
    before = t.fingerprint()
    (tmp_path / "board.ini").write_text((tmp_path / "board.ini").read_text() + "; edited\n")
    assert t.fingerprint() != before, "editing the vela.ini must change the target's fingerprint"
