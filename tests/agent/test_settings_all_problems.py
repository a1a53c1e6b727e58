"""The agent reports every bad setting in one run, each named by the flag or variable that
gave it, and takes each on/off flag alone or with true/false."""

import argparse

import pytest

from agent import cli
from agent.settings import SettingsError, _parser, parse_settings

SWITCHES = [a for a in _parser()._actions if a.option_strings and a.nargs == "?"]


def problems(argv: list[str], env: dict[str, str]) -> list[str]:
    with pytest.raises(SettingsError) as raised:
        parse_settings(argv, env=env)
    return str(raised.value).split("; ")


def test_a_missing_node_name_and_bad_values_are_reported_together() -> None:
    found = problems(
        ["--log-level=LOUD", "--board-publish-seconds=5", "--gpu-manager-metrics=maybe"],
        {"FRACGPU_AGENT_METRICS_PORT": "70000", "FRACGPU_AGENT_HEALTH_PROBE_SECONDS": "soon"},
    )
    assert sorted(found) == sorted(
        [
            "the node name is required: pass --node-name or set NODE_NAME",
            "--log-level=LOUD is not allowed: use one of DEBUG, INFO, WARNING, ERROR",
            "--board-publish-seconds=5.0 is not allowed: use 0.005 to 1",
            "--gpu-manager-metrics=maybe is not allowed: use true or false (or 1/0, yes/no), "
            "or the flag alone for true",
            "FRACGPU_AGENT_METRICS_PORT=70000 is not allowed: use 0-65535",
            "FRACGPU_AGENT_HEALTH_PROBE_SECONDS=soon is not allowed: use a number",
        ]
    )


def test_an_unreadable_flag_and_an_unknown_one_come_with_the_missing_node_name() -> None:
    found = problems(["--metrics-port=abc", "--metrics-prot=9400"], {})
    assert "--metrics-port=abc is not allowed: use a whole number" in found
    assert any(p.startswith("unrecognized argument --metrics-prot=9400") for p in found), found
    assert "the node name is required: pass --node-name or set NODE_NAME" in found


def test_fracgpu_agent_prints_every_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("FRACGPU_AGENT_NODE_NAME", raising=False)
    assert cli.main(["--log-level=LOUD"]) == 2
    err = capsys.readouterr().err
    assert "--log-level=LOUD is not allowed" in err
    assert "the node name is required" in err


def test_a_path_setting_from_the_environment_is_named_as_the_variable() -> None:
    env = {"FRACGPU_AGENT_SLICE_AUDIT_KILL": "true", "FRACGPU_AGENT_SLICE_AUDIT_PROC_DIR": "/h"}
    assert problems(["--node-name=n"], env) == [
        "FRACGPU_AGENT_SLICE_AUDIT_KILL needs the host's PID namespace: run the agent with "
        "hostPID and FRACGPU_AGENT_SLICE_AUDIT_PROC_DIR=/proc (not /h)"
    ]


def test_a_number_setting_from_the_environment_is_named_as_the_variable() -> None:
    env = {"FRACGPU_AGENT_SLICE_AUDIT_TOLERANCE_BYTES": "-1"}
    (found,) = problems(["--node-name=n"], env)
    assert found.startswith("FRACGPU_AGENT_SLICE_AUDIT_TOLERANCE_BYTES: "), found


def test_there_are_on_off_flags_to_check() -> None:
    flags = {a.option_strings[0] for a in SWITCHES}
    assert flags == {"--gpu-manager-metrics", "--slice-audit-kill", "--no-publish-inventory"}


@pytest.mark.parametrize("action", SWITCHES, ids=lambda a: a.option_strings[0])
def test_every_on_off_flag_takes_the_bare_form_and_a_value(action: argparse.Action) -> None:
    flag = action.option_strings[0]
    variable = "FRACGPU_AGENT_" + flag.removeprefix("--").replace("-", "_").upper()

    def read(argv: list[str], env: dict[str, str] | None = None) -> object:
        s = parse_settings(["--node-name=n", *argv], env=env or {})
        return (
            not s.publish_inventory
            if action.dest == "no_publish_inventory"
            else (getattr(s, action.dest))
        )

    assert read([]) is False
    assert read([flag]) is True
    assert read([flag, "--metrics-port=0"]) is True
    assert read([f"{flag}=true"]) is True
    assert read([flag, "false"]) is False
    assert read([f"{flag}=no"]) is False
    assert read([], {variable: "yes"}) is True
    assert read([flag, "false"], {variable: "true"}) is False  # the flag wins
    assert problems(["--node-name=n", flag, "maybe"], {}) == [
        f"{flag}=maybe is not allowed: use true or false (or 1/0, yes/no), or the flag alone "
        "for true"
    ]
