"""The agent's settings: flags, FRACGPU_AGENT_* environment, clear errors."""

from pathlib import Path

import pytest

from agent.settings import SettingsError, _parser, parse_settings, unknown_variables


def test_defaults_need_only_the_node_name() -> None:
    s = parse_settings([], env={"NODE_NAME": "gpu-1"})
    assert s.node_name == "gpu-1"
    assert s.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert s.compute_resource == "tencent.com/vcuda-core"
    assert s.ignored_xids == (13, 31, 43, 45, 68, 109)
    assert s.publish_inventory


def test_environment_sets_and_flags_win() -> None:
    env = {
        "NODE_NAME": "gpu-1",
        "FRACGPU_AGENT_METRICS_PORT": "9500",
        "FRACGPU_AGENT_IGNORED_XIDS": "13,43",
        "FRACGPU_AGENT_NO_PUBLISH_INVENTORY": "true",
        "FRACGPU_AGENT_HOST_LIB_DIR": "/opt/fracgpu/lib",
    }
    s = parse_settings(["--metrics-port=9600", "--node-name=gpu-2"], env=env)
    assert s.metrics_port == 9600
    assert s.node_name == "gpu-2"
    assert s.ignored_xids == (13, 43)
    assert not s.publish_inventory
    assert s.host_lib_dir == Path("/opt/fracgpu/lib")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the node name is required"),
        (["--node-name=n", "--log-level=LOUD"], "--log-level=LOUD is not allowed"),
        (["--node-name=n", "--ignored-xids=13,x"], "comma-separated integers"),
        (["--node-name=n", "--health-probe-seconds=0"], "--health-probe-seconds must be"),
        (["--node-name=n", "--compute-resource=vcuda"], "domain-qualified resource name"),
        (
            ["--node-name=n", "--memory-resource=tencent.com/vcuda-core"],
            "must differ",
        ),
        (["--node-name=n", "--context-overhead-bytes=-1"], "must be auto or 0 to 4294967296"),
        (["--node-name=n", "--context-overhead-bytes=4294967297"], "must be auto or 0 to"),
        (
            ["--node-name=n", "--context-overhead-bytes=300Mi"],
            "(bytes per CUDA context), not 300Mi",
        ),
    ],
)
def test_bad_values_say_what_is_allowed(args: list[str], message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        parse_settings(args, env={})
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"FRACGPU_AGENT_METRICS_PORT": "abc"},
            "FRACGPU_AGENT_METRICS_PORT=abc is not allowed: use a whole number",
        ),
        (
            {"FRACGPU_AGENT_HEALTH_PROBE_SECONDS": "soon"},
            "FRACGPU_AGENT_HEALTH_PROBE_SECONDS=soon is not allowed: use a number",
        ),
        (
            {"FRACGPU_AGENT_METRICS_PORT": "70000"},
            "FRACGPU_AGENT_METRICS_PORT=70000 is not allowed: use 0-65535",
        ),
        (
            {"FRACGPU_AGENT_HOUSEKEEPING_SECONDS": "0"},
            "FRACGPU_AGENT_HOUSEKEEPING_SECONDS must be greater than 0, not 0.0",
        ),
        (
            {"FRACGPU_AGENT_NO_PUBLISH_INVENTORY": "maybe"},
            "FRACGPU_AGENT_NO_PUBLISH_INVENTORY=maybe is not allowed: use true or false",
        ),
        (
            {"FRACGPU_AGENT_CONTEXT_OVERHEAD_BYTES": "lots"},
            "FRACGPU_AGENT_CONTEXT_OVERHEAD_BYTES must be auto or 0 to",
        ),
    ],
)
def test_bad_environment_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        parse_settings(["--node-name=n"], env=env)
    assert message in str(raised.value)


def test_a_flag_overrides_a_bad_environment_value() -> None:
    env = {"FRACGPU_AGENT_METRICS_PORT": "abc", "FRACGPU_AGENT_NO_PUBLISH_INVENTORY": "false"}
    s = parse_settings(["--node-name=n", "--metrics-port=9500"], env=env)
    assert s.metrics_port == 9500
    assert s.publish_inventory


def test_log_level_error_lists_the_levels_readably() -> None:
    with pytest.raises(SettingsError) as raised:
        parse_settings(["--node-name=n", "--log-level=verbose"], env={})
    assert str(raised.value) == (
        "--log-level=verbose is not allowed: use one of DEBUG, INFO, WARNING, ERROR"
    )


@pytest.mark.parametrize("value", ["0.5", "17"])
def test_memory_scaling_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings(["--node-name", "n", "--memory-scaling", value])
    assert f"--memory-scaling={float(value)} is not allowed: use a factor from 1 to 16" in str(
        info.value
    )


def test_memory_scaling_is_read_from_the_environment() -> None:
    settings = parse_settings(["--node-name", "n"], {"FRACGPU_AGENT_MEMORY_SCALING": "2.5"})
    assert settings.memory_scaling == 2.5


def test_every_flag_is_documented() -> None:
    """docs/agent.md lists each flag the agent accepts, so the table cannot fall behind."""
    text = (Path(__file__).parents[2] / "docs" / "agent.md").read_text()
    flags = [
        option
        for action in _parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    assert flags
    missing = [flag for flag in flags if f"`{flag}`" not in text]
    assert not missing, f"docs/agent.md does not list {missing}"


def test_context_overhead_is_read_from_the_environment_and_is_measured_by_default() -> None:
    # None: measured at start-up (agent/context_probe.py)
    assert parse_settings(["--node-name=n"], env={}).context_overhead_bytes is None
    env = {"FRACGPU_AGENT_CONTEXT_OVERHEAD_BYTES": str(512 << 20)}
    assert parse_settings(["--node-name=n"], env=env).context_overhead_bytes == 512 << 20
    assert (
        parse_settings(
            ["--node-name=n", "--context-overhead-bytes=0"], env=env
        ).context_overhead_bytes
        == 0
    )
    env = {"FRACGPU_AGENT_CONTEXT_OVERHEAD_BYTES": "Auto"}
    assert parse_settings(["--node-name=n"], env=env).context_overhead_bytes is None


def test_a_misspelt_agent_variable_is_named_with_the_one_meant() -> None:
    environ = {"FRACGPU_AGENT_METRICS_PROT": "9400", "FRACGPU_AGENT_METRICS_PORT": "9400"}
    assert unknown_variables(environ) == [
        "FRACGPU_AGENT_METRICS_PROT is not a setting (did you mean "
        "FRACGPU_AGENT_METRICS_PORT?): it is ignored"
    ]
    assert unknown_variables({"FRACGPU_POLICY": "x"}) == []  # the webhook's
