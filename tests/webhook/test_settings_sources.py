"""Messages name the flag or the variable a value came from; on/off flags take both forms."""

import argparse
from pathlib import Path

import pytest

from fracgpu.model import MemoryRequest
from webhook import settings
from webhook.cli import main as cli

DOCS = Path(__file__).resolve().parents[2] / "docs"
BOOLEAN_OPTIONS = [o for o in settings.OPTIONS if o.default in ("true", "false")]


def parse(argv: list[str], env: dict[str, str]) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return settings.load(parser.parse_args(argv), env)


def refusal(argv: list[str], env: dict[str, str]) -> str:
    with pytest.raises(settings.SettingsError) as raised:
        parse(argv, env)
    return str(raised.value)


def test_colliding_resource_names_are_named_with_the_shared_value() -> None:
    message = refusal(
        ["--resource-vcuda-core", "nvidia.com/gpu"],
        {
            "FRACGPU_RESOURCE_GPUSHARE_MEM": "example.com/x",
            "FRACGPU_RESOURCE_GPUSHARE_COUNT": "example.com/x",
        },
    )
    assert message.startswith(
        "--resource-vcuda-core and --resource-hami-gpu (its default) are both 'nvidia.com/gpu'; "
        "FRACGPU_RESOURCE_GPUSHARE_MEM and FRACGPU_RESOURCE_GPUSHARE_COUNT are both "
        "'example.com/x': each --resource-* setting must name a different resource"
    ), message


def test_a_missing_kubeconfig_names_the_variable_it_came_from(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    assert refusal([], {"FRACGPU_KUBECONFIG": str(absent)}).startswith(
        f"FRACGPU_KUBECONFIG={absent}: the file does not exist (give the path of a kubeconfig "
        "file, or --in-cluster"
    )
    assert refusal(["--kubeconfig", str(absent)], {}).startswith(
        f"--kubeconfig {absent}: the file does not exist"
    )
    assert refusal([], {"FRACGPU_KUBECONFIG": str(tmp_path)}).startswith(
        f"FRACGPU_KUBECONFIG={tmp_path}: it is not a file"
    )
    # admit reads no cluster-mode setting: a variable left over does not stop it
    settings.load(None, {"FRACGPU_KUBECONFIG": str(absent)}, settings.ADMIT_SCOPES)


def test_fracgpu_serve_names_the_kubeconfig_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FRACGPU_KUBECONFIG", str(tmp_path / "absent"))
    assert cli.main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fracgpu: FRACGPU_KUBECONFIG={tmp_path / 'absent'}: "), err


def test_a_relation_names_the_variables_and_the_defaults_it_compared() -> None:
    message = refusal([], {"FRACGPU_SETTLE_SECONDS": "400"})
    assert message.startswith(
        "FRACGPU_SETTLE_SECONDS (400) must be less than --reservation-ttl-seconds (default 300)"
    ), message
    message = refusal(["--settle-seconds", "400"], {"FRACGPU_RESERVATION_TTL_SECONDS": "300"})
    assert message.startswith(
        "--settle-seconds (400) must be less than FRACGPU_RESERVATION_TTL_SECONDS (300)"
    ), message


def test_settings_that_go_together_or_exclude_each_other_are_named_as_given() -> None:
    assert refusal([], {"FRACGPU_TLS_KEY_FILE": "/k"}).startswith(
        "FRACGPU_TLS_KEY_FILE is set but --tls-cert-file (FRACGPU_TLS_CERT_FILE) is not"
    )
    assert refusal(["--in-cluster"], {"FRACGPU_CLUSTER_FILE": "/c"}).startswith(
        "FRACGPU_CLUSTER_FILE and --in-cluster exclude each other"
    )


def test_there_are_on_off_settings_to_check() -> None:
    assert {o.key for o in BOOLEAN_OPTIONS} >= {"in_cluster", "disable_core_limit"}


@pytest.mark.parametrize("option", BOOLEAN_OPTIONS, ids=lambda o: o.flag)
def test_every_on_off_flag_takes_the_bare_form_and_a_value(option: settings.Option) -> None:
    def value(argv: list[str], env: dict[str, str] | None = None) -> object:
        return getattr(parse(argv, env or {}), option.key)

    assert value([option.flag]) is True
    assert value([f"{option.flag}=true"]) is True
    assert value([option.flag, "false"]) is False
    assert value([option.flag, "no"]) is False
    assert value([option.flag], {option.env: "false"}) is True  # the flag wins
    assert value([], {option.env: "true"}) is True
    assert refusal([option.flag, "maybe"], {}) == (
        f"{option.flag}='maybe' is not allowed: use true or false (or 1/0, yes/no), or the "
        "flag alone for true"
    )
    assert refusal([], {option.env: "maybe"}).startswith(f"{option.env}='maybe' is not allowed")


def test_the_commands_take_a_bare_on_off_flag_before_other_flags() -> None:
    parser = cli._parser()
    serve = parser.parse_args(["serve", "--in-cluster", "--port", "0"])
    assert settings.load(serve, {}).in_cluster is True
    admit = parser.parse_args(["admit", "pod.yaml", "--disable-core-limit"])
    assert settings.load(admit, {}, settings.ADMIT_SCOPES).disable_core_limit is True


@pytest.mark.parametrize(
    ("text", "mib"),
    [("4Gi", 4096), ("4G", 3840), ("4096", 4096), ("4096Mi", 4096), ("1.5Gi", 1536)],
)
def test_default_gpu_memory_reads_quantities_as_kubernetes_does(text: str, mib: int) -> None:
    """Gi is 2^30 bytes, G is 10^9: 4G is 3815 MiB, rounded up to 3840 (256 MiB blocks)."""
    config = parse(["--default-gpu-memory", text], {})
    assert config.dialects.default_memory == MemoryRequest(mib=mib)


def test_the_docs_say_what_each_memory_suffix_means() -> None:
    configuration = (DOCS / "configuration.md").read_text()
    note = configuration[configuration.index("- **Defaults for omitted amounts**") :]
    note = " ".join(note[: note.index("\n- **", 1)].split())
    for says in ("`Gi` = 2^30", "`G` = 10^9", "`4G` is", "3815 MiB", "a plain whole number"):
        assert says in note, says
    migration = (DOCS / "migration.md").read_text().splitlines()
    row = next(line for line in migration if line.startswith("| `nvidia.defaultMem`"))
    assert "`G` = 10^9" in row and "`Gi` = 2^30" in row, row
