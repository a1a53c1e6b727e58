"""One settings object from flags and environment; every option documented."""

import argparse
from pathlib import Path

import pytest

from fracgpu.model import MemoryRequest
from fracgpu.placement import Policy
from webhook import settings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def parse(argv: list[str], env: dict[str, str]) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return settings.load(parser.parse_args(argv), env)


def test_defaults() -> None:
    config = parse([], {})
    assert config.port == 8443
    assert config.policy is Policy.FRAGMENTATION
    assert config.dialects.default_memory == MemoryRequest(percent=100)
    assert config.dialects.default_cores == 0
    assert config.max_body_bytes == 8 * 1024 * 1024
    assert "system:serviceaccount:fracgpu-system:fracgpu-webhook" in config.service_accounts


def test_flags_beat_environment_beats_defaults() -> None:
    env = {"FRACGPU_PORT": "9443", "FRACGPU_POLICY": "spread", "FRACGPU_SPLIT_COUNT": "4"}
    config = parse(["--port", "10443"], env)
    assert (config.port, config.policy, config.split_count) == (10443, Policy.SPREAD, 4)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("50%", MemoryRequest(percent=50)),
        ("4096", MemoryRequest(mib=4096)),
        ("1Gi", MemoryRequest(mib=1024)),
        ("1000", MemoryRequest(mib=1024)),
    ],
)
def test_default_gpu_memory_forms(value: str, expected: MemoryRequest) -> None:
    assert parse(["--default-gpu-memory", value], {}).dialects.default_memory == expected


def test_service_accounts_and_resource_names() -> None:
    config = parse(
        ["--resource-hami-gpu", "example.com/vgpu"],
        {"FRACGPU_SERVICE_ACCOUNTS": "system:serviceaccount:a:b, system:serviceaccount:c:d"},
    )
    assert config.service_accounts == {"system:serviceaccount:a:b", "system:serviceaccount:c:d"}
    assert config.dialects.names.hami_gpu == "example.com/vgpu"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "70000"], {}, "--port='70000' is not allowed: use 0-65535"),
        (
            [],
            {"FRACGPU_POLICY": "random"},
            "FRACGPU_POLICY='random' is not allowed: use one of binpack, spread",
        ),
        ([], {"FRACGPU_DEFAULT_GPU_CORES": "120"}, "use 0-100"),
        ([], {"FRACGPU_DEFAULT_GPU_MEMORY": "150%"}, "use 1%-100%"),
        ([], {"FRACGPU_GPUSHARE_MEMORY_UNIT": "KiB"}, "use GiB or MiB"),
        ([], {"FRACGPU_SPLIT_COUNT": "0"}, "use a whole number of 1 or more"),
        ([], {"FRACGPU_MAX_BODY_BYTES": "many"}, "FRACGPU_MAX_BODY_BYTES='many' is not allowed"),
        (["--resource-vcuda-core", "gpu"], {}, "use a qualified extended resource name"),
        (["--resource-vcuda-core", "nvidia.com/gpu"], {}, "resource names must all differ"),
        (["--tls-cert-file", "/x.crt"], {}, "--tls-cert-file and --tls-key-file go together"),
        ([], {"FRACGPU_LOG_LEVEL": "chatty"}, "use DEBUG, INFO, WARNING or ERROR"),
    ],
)
def test_bad_values_name_their_source_and_what_is_allowed(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(settings.SettingsError) as raised:
        parse(argv, env)
    assert message in str(raised.value)


def test_from_mapping_rejects_unknown_keys() -> None:
    with pytest.raises(settings.SettingsError, match="unknown setting"):
        settings.from_mapping({"colour": "blue"})


def test_every_option_is_documented() -> None:
    text = DOCS.read_text()
    for option in settings.OPTIONS:
        assert f"`{option.flag}`" in text, option.flag
        assert f"`{option.env}`" in text, option.env


def test_a_malformed_number_is_named_in_words_not_python() -> None:
    for argv, env, message in (
        (["--port", "abc"], {}, "--port='abc' is not allowed: not a whole number"),
        ([], {"FRACGPU_SETTLE_SECONDS": "soon"}, "FRACGPU_SETTLE_SECONDS='soon' is not allowed"),
    ):
        with pytest.raises(settings.SettingsError) as raised:
            parse(argv, env)
        assert message in str(raised.value)
        assert "invalid literal" not in str(raised.value)
        assert "could not convert" not in str(raised.value)


def test_the_startup_log_shows_settings_as_an_operator_writes_them() -> None:
    lines = settings.describe(parse(["--cluster-file", "examples/cluster.yaml"], {}))
    text = "\n".join(lines)
    assert "cluster_file=examples/cluster.yaml" in lines
    assert "policy=fragmentation" in lines
    assert "tls_cert_file=(unset)" in lines
    for python in ("PosixPath(", "<Policy.", "DialectConfig(", "frozenset(", "None"):
        assert python not in text
