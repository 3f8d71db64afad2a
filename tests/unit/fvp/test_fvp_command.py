"""FVP command lines per board target, and FVP/runner discovery (no FVP is run)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from edgedeploy.errors import ToolMissingError, UsageError
from edgedeploy.fvp import discovery
from edgedeploy.fvp.command import (
    FvpInvocation,
    build_fvp_command,
    config_options,
    cpu_instance,
    mlek_build_options,
    region_limits,
    timelimit_for,
)
from edgedeploy.config.targets import get_target, list_targets

BOARDS = ["corstone-300-u55-128", "corstone-300-u65-256", "corstone-310-u55-256", "corstone-320-u85-256"]

# The -C options Arm's tools pass for each board, as quoted in ../shared/data/fvp/COMMANDS.md:
# Corstone-300: ExecuTorch run_fvp.sh U55/U65 branch, TFLM test_with_arm_corstone_300.sh (unbuffered_output);
# Corstone-310: MLEK 26.03 Dockerfile FVP_310_ARGS, FreeRTOS run.sh (unbuffered_output), MLIA (ethosu.num_macs);
# Corstone-320: ExecuTorch run_fvp.sh U85 branch.
MPS3 = [
    "mps3_board.visualisation.disable-visualisation=1",
    "mps3_board.telnetterminal0.start_telnet=0",
    "mps3_board.uart0.out_file=-",
    "mps3_board.uart0.unbuffered_output=1",
    "mps3_board.uart0.shutdown_on_eot=1",
]
ARM_OPTIONS = {
    "corstone-300-u55-128": ("FVP_Corstone_SSE-300_Ethos-U55", ["ethosu.num_macs=128", *MPS3]),
    "corstone-300-u65-256": ("FVP_Corstone_SSE-300_Ethos-U65", ["ethosu.num_macs=256", *MPS3]),
    "corstone-310-u55-256": ("FVP_Corstone_SSE-310", ["ethosu.num_macs=256", *MPS3]),
    "corstone-320-u85-256": (
        "FVP_Corstone_SSE-320",
        [
            "mps4_board.subsystem.ethosu.num_macs=256",
            "mps4_board.visualisation.disable-visualisation=1",
            "vis_hdlcd.disable_visualisation=1",
            "mps4_board.telnetterminal0.start_telnet=0",
            "mps4_board.uart0.out_file=-",
            "mps4_board.uart0.unbuffered_output=1",
            "mps4_board.uart0.shutdown_on_eot=1",
        ],
    ),
}
# MLEK inference_runner with dynamic loading: --data model@0x90000000 --data ifm@0x92000000
# --dump cpu0=out@Memory:0x93000000,N (docs/use_cases/inference_runner.md); on MPS4 the CPU is
# mps4_board.subsystem.cpu0.
DUMP_INSTANCE = {
    "corstone-300-u55-128": "cpu0",
    "corstone-300-u65-256": "cpu0",
    "corstone-310-u55-256": "cpu0",
    "corstone-320-u85-256": "mps4_board.subsystem.cpu0",
}


def c_options(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-C"]


def test_the_built_in_boards_are_these_four():
    assert sorted(t.name for t in list_targets() if t.kind == "board") == BOARDS


@pytest.mark.parametrize("name", BOARDS)
def test_argv_matches_arm_command_lines(name, tmp_path):
    target = get_target(name)
    binary, arm_options = ARM_OPTIONS[name]
    assert target.fvp.binary == binary
    inv = FvpInvocation(
        fvp=Path("/opt/fvp") / binary,
        runner=Path("/r/ethos-u-inference_runner.axf"),
        model=Path("/run/model_int8_vela.tflite"),
        input_bin=Path("/run/input.bin"),
        output_bin=Path("/run/output.bin"),
        output_bytes=12,
        timelimit_s=590,
    )
    argv = build_fvp_command(target, inv)
    assert argv[0] == f"/opt/fvp/{binary}"
    options = c_options(argv)
    assert options[0] == arm_options[0]  # the NPU's MAC count comes first
    assert sorted(options) == sorted(arm_options)  # the FVP does not care about the order of -C options
    rest = argv[1 + 2 * len(arm_options):]
    assert rest == [
        "-a", "/r/ethos-u-inference_runner.axf",
        "--data", "/run/model_int8_vela.tflite@0x90000000",
        "--data", "/run/input.bin@0x92000000",
        "--dump", f"{DUMP_INSTANCE[name]}=/run/output.bin@Memory:0x93000000,12",
        "--stat",
        "--timelimit", "590",
    ]  # fmt: skip
    assert not any("'" in a or '"' in a for a in argv)  # argv, not shell text: no quoting left


def test_argv_without_input_or_dump():
    target = get_target("corstone-300-u55-128")
    argv = build_fvp_command(target, FvpInvocation(Path("F"), Path("r.axf"), Path("m.tflite"), stat=False))
    assert "--dump" not in argv and "--stat" not in argv and "--timelimit" not in argv
    assert argv[-4:] == ["-a", "r.axf", "--data", "m.tflite@0x90000000"]


def test_mac_count_override_and_cpu_instance():
    target = get_target("corstone-300-u55-128")
    assert config_options(target, macs=256)[:2] == ["-C", "ethosu.num_macs=256"]
    assert cpu_instance(target) == "cpu0"
    assert cpu_instance(get_target("corstone-320-u85-256")) == "mps4_board.subsystem.cpu0"


def test_npu_only_target_has_no_fvp_command():
    target = get_target("ethos-u55-128")
    with pytest.raises(UsageError, match="not a board"):
        build_fvp_command(target, FvpInvocation(Path("F"), Path("r"), Path("m")))


def test_timelimit_stops_the_fvp_before_the_subprocess_timeout():
    for timeout in (1, 5, 30, 600, 3600):
        limit = timelimit_for(timeout)
        assert 1 <= limit
        if timeout > 10:
            assert limit < timeout
    assert timelimit_for(600) == 540
    assert timelimit_for(60) == 50


def test_region_limits_follow_the_addresses():
    limits = region_limits(get_target("corstone-300-u55-128"))
    assert limits == {"model": 0x0200_0000, "input": 0x0100_0000, "output": 0x0100_0000}


@pytest.mark.parametrize(
    "name,expected",
    [
        ("corstone-300-u55-128", ["-DTARGET_PLATFORM=mps3", "-DTARGET_SUBSYSTEM=sse-300", "-DETHOS_U_NPU_ID=U55",
                                  "-DETHOS_U_NPU_CONFIG_ID=H128", "-DETHOS_U_NPU_MEMORY_MODE=Shared_Sram"]),
        ("corstone-300-u65-256", ["-DTARGET_PLATFORM=mps3", "-DTARGET_SUBSYSTEM=sse-300", "-DETHOS_U_NPU_ID=U65",
                                  "-DETHOS_U_NPU_CONFIG_ID=Y256", "-DETHOS_U_NPU_MEMORY_MODE=Dedicated_Sram",
                                  "-DETHOS_U_NPU_CACHE_SIZE=393216"]),
        ("corstone-310-u55-256", ["-DTARGET_PLATFORM=mps3", "-DTARGET_SUBSYSTEM=sse-310", "-DETHOS_U_NPU_ID=U55",
                                  "-DETHOS_U_NPU_CONFIG_ID=H256", "-DETHOS_U_NPU_MEMORY_MODE=Shared_Sram"]),
        ("corstone-320-u85-256", ["-DTARGET_PLATFORM=mps4", "-DTARGET_SUBSYSTEM=sse-320", "-DETHOS_U_NPU_ID=U85",
                                  "-DETHOS_U_NPU_CONFIG_ID=Z256", "-DETHOS_U_NPU_MEMORY_MODE=Dedicated_Sram",
                                  "-DETHOS_U_NPU_CACHE_SIZE=393216"]),
    ],
)
def test_runner_build_options(name, expected):
    assert mlek_build_options(get_target(name)) == expected


@pytest.mark.requires_data("fvp/COMMANDS.md")
@pytest.mark.parametrize("name", BOARDS)
def test_expected_options_are_quoted_in_arm_command_lines(name, shared_data):
    """Every option expected above appears in the FVP command lines Arm's tools use (COMMANDS.md)."""
    text = (shared_data / "fvp" / "COMMANDS.md").read_text(encoding="utf-8")
    text = text.replace("='-'", "=-").replace('="-"', "=-")  # what the shell passes
    binary, options = ARM_OPTIONS[name]
    assert binary in text
    for option in options:
        key, _, value = option.partition("=")
        assert re.search(re.escape(key) + r"=(?:\$\{num_macs\}|\{cfg\.mac\}|" + re.escape(value) + ")", text), option
    assert re.search(r"--dump cpu0=\S+@Memory:0x93000000,\d+", text)
    assert "--data /path/to/custom-model.tflite@0x90000000" in text
    assert "--data /path/to/custom-ifm.bin@0x92000000" in text


# --------------------------------------------------------------------------- discovery


def make_executable(path: Path, text: str = "#!/bin/sh\necho 'not an FVP' >&2\nexit 127\n") -> Path:
    """A placeholder file with the FVP's name, for discovery only; it is never run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_system_fvps(monkeypatch, tmp_path):
    """Hide any FVP the machine has, so discovery sees only what a test creates."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(discovery, "usual_install_dirs", lambda: [])
    monkeypatch.delenv(discovery.ENV_RUNNER, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)


def test_nothing_installed(no_system_fvps):
    assert discovery.find_any_fvp() is None
    with pytest.raises(ToolMissingError) as err:
        discovery.find_fvp(get_target("corstone-320-u85-256"))
    text = err.value.one_line()
    assert "FVP_Corstone_SSE-320" in text and "corstone-320-u85-256" in text
    assert discovery.FVP_DOWNLOAD_PAGE in text and "EDGEDEPLOY_FVP_DIR" in text
    assert "\n" not in text
    assert err.value.exit_code == 5


def test_env_dir_with_arm_install_layout(no_system_fvps, tmp_path, monkeypatch):
    root = tmp_path / "FVP_Corstone_SSE-300"
    exe = make_executable(root / "models" / "Linux64_GCC-9.3" / "FVP_Corstone_SSE-300_Ethos-U55")
    monkeypatch.setenv("EDGEDEPLOY_FVP_DIR", str(root))
    found = discovery.find_fvp(get_target("corstone-300-u55-128"))
    assert found.path == exe and found.how == "$EDGEDEPLOY_FVP_DIR"
    assert discovery.find_any_fvp() == exe
    with pytest.raises(ToolMissingError):  # the U65 executable is not there
        discovery.find_fvp(get_target("corstone-300-u65-256"))


def test_env_dir_one_level_down_and_path(no_system_fvps, tmp_path, monkeypatch):
    fvps = tmp_path / "fvps"
    exe = make_executable(fvps / "FVP_Corstone_SSE-320" / "models" / "Linux64_armv8l_GCC-9.3" / "FVP_Corstone_SSE-320")
    monkeypatch.setenv("EDGEDEPLOY_FVP_DIR", f"{tmp_path / 'nothing'}{os.pathsep}{fvps}")
    assert discovery.find_fvp(get_target("corstone-320-u85-256")).path == exe
    monkeypatch.delenv("EDGEDEPLOY_FVP_DIR")
    bindir = tmp_path / "bin"
    on_path = make_executable(bindir / "FVP_Corstone_SSE-310")
    monkeypatch.setenv("PATH", str(bindir))
    found = discovery.find_fvp(get_target("corstone-310-u55-256"))
    assert (found.path, found.how) == (on_path, "PATH")


def test_usual_install_folder_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # HOME is the test's own (conftest)
    home = Path(os.environ["HOME"])
    models = home / "FVP_Corstone_SSE-300" / "models" / "Linux64_GCC-6.4"
    exe = make_executable(models / "FVP_Corstone_SSE-300_Ethos-U65")
    found = discovery.locate_fvp_binary("FVP_Corstone_SSE-300_Ethos-U65")
    assert found is not None and found.path == exe and found.how == "install folder"


def test_non_executable_file_is_ignored(no_system_fvps, tmp_path, monkeypatch):
    path = tmp_path / "FVP_Corstone_SSE-310"
    path.write_text("")
    monkeypatch.setenv("EDGEDEPLOY_FVP_DIR", str(tmp_path))
    assert discovery.locate_fvp_binary("FVP_Corstone_SSE-310") is None


def test_explicit_fvp_path(no_system_fvps, tmp_path):
    target = get_target("corstone-300-u55-128")
    exe = make_executable(tmp_path / "FVP_Corstone_SSE-300_Ethos-U55")
    assert discovery.find_fvp(target, exe).how == "--fvp"
    assert discovery.find_fvp(target, tmp_path).path == exe  # a folder is searched
    avh = make_executable(tmp_path / "VHT_Corstone_SSE-300_Ethos-U55")
    assert discovery.find_fvp(target, avh).path == avh
    wrapper = make_executable(tmp_path / "run-my-fvp.sh")
    assert discovery.find_fvp(target, wrapper).path == wrapper
    with pytest.raises(UsageError, match="FVP of another board"):
        discovery.find_fvp(target, make_executable(tmp_path / "FVP_Corstone_SSE-320"))
    with pytest.raises(ToolMissingError, match="does not exist"):
        discovery.find_fvp(target, tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ToolMissingError, match="is not installed"):
        discovery.find_fvp(target, empty)


def test_runner_discovery(no_system_fvps, tmp_path, monkeypatch):
    target = get_target("corstone-300-u55-128")
    with pytest.raises(ToolMissingError) as err:
        discovery.find_runner(target)
    hint = err.value.one_line()
    assert "inference_runner" in hint and "-Dinference_runner_DYNAMIC_MEM_LOAD_ENABLED=ON" in hint
    assert "-DTARGET_SUBSYSTEM=sse-300" in hint and "EDGEDEPLOY_FVP_RUNNER" in hint

    # the default folder, by target name
    default = discovery.default_runner_dir()
    assert default == Path(os.environ["HOME"]) / ".local" / "share" / "edgedeploy" / "runners"
    axf = default / "corstone-300-u55-128" / "ethos-u-inference_runner.axf"
    axf.parent.mkdir(parents=True)
    axf.write_bytes(b"\x7fELF")
    assert discovery.find_runner(target).path == axf
    assert discovery.locate_runner("corstone-320-u85-256") is None

    # the environment: a folder with <target>.axf, or one file for every board
    folder = tmp_path / "runners"
    folder.mkdir()
    (folder / "corstone-320-u85-256.axf").write_bytes(b"\x7fELF")
    monkeypatch.setenv("EDGEDEPLOY_FVP_RUNNER", str(folder))
    assert discovery.find_runner(get_target("corstone-320-u85-256")).how == "$EDGEDEPLOY_FVP_RUNNER"
    single = tmp_path / "mlek_inference_runner.axf"
    single.write_bytes(b"\x7fELF")
    monkeypatch.setenv("EDGEDEPLOY_FVP_RUNNER", str(single))
    assert discovery.find_runner(get_target("corstone-310-u55-256")).path == single

    # explicit
    assert discovery.find_runner(target, single).how == "--runner"
    with pytest.raises(ToolMissingError, match="does not exist"):
        discovery.find_runner(target, tmp_path / "nope.axf")
