"""The trace replay of bench/placement on tiny traces whose numbers can be worked out by hand."""

import math
from pathlib import Path

import pytest

from bench.cli import main as bench_main
from bench.placement.cli import DEFAULT_NODES, DEFAULT_PODS, build_parser, default_path
from bench.placement.replay import arrival_order, bin_x, replay
from bench.placement.report import big_refusal_or_end, summarize
from bench.placement.synth import GPUSPEC_FREQUENCY, synthesize
from bench.placement.trace import (
    TraceError,
    TraceNode,
    TracePod,
    read_nodes,
    read_pods,
    write_nodes,
    write_pods,
)
from fracgpu.placement import Policy

NODES = [TraceNode("n0", 8000, 32768, 1, "T4"), TraceNode("n1", 8000, 32768, 1, "V100")]


def pod(
    name: str, gpu_milli: int, num_gpu: int = 1, cpu: int = 1000, spec: tuple[str, ...] = ()
) -> TracePod:
    return TracePod(name, cpu, 1024, num_gpu if gpu_milli else 0, gpu_milli, spec)


def test_bin_x_rounds_halves_up() -> None:
    assert [bin_x(a, 1000) for a in (0, 4, 5, 994, 995, 1000, 1304)] == [0, 0, 1, 99, 100, 100, 130]


def test_arrival_order_is_a_shuffle_then_clones_up_to_tune() -> None:
    pods = [pod(f"p{i}", 100 * (i + 1)) for i in range(5)] + [pod("cpu", 0)]
    capacity = 2000
    order = arrival_order(pods, seed=7, tune=1.3, capacity=capacity)
    assert sorted(order[:6]) == list(range(6))
    total = sum(pods[i].gpu_request for i in order)
    assert total <= 1.3 * capacity
    assert order == arrival_order(pods, seed=7, tune=1.3, capacity=capacity)
    assert order != arrival_order(pods, seed=8, tune=1.3, capacity=capacity)


def test_arrival_order_needs_gpu_pods() -> None:
    with pytest.raises(TraceError, match="no GPU pods"):
        arrival_order([pod("cpu", 0)], seed=1, tune=1.3, capacity=1000)


@pytest.mark.parametrize("policy", [Policy.BINPACK, Policy.BEST_FIT, Policy.FRAGMENTATION])
def test_replay_of_a_tiny_trace(policy: Policy) -> None:
    """Two GPUs (capacity 2000): 600 + 400 fill one GPU, 1000 takes the other; tune 1.0 adds
    no clone. In every order a packing policy ends at x=100 with all 2000 used."""
    pods = [pod("a", 600), pod("b", 400), pod("c", 1000)]
    result = replay(NODES, pods, policy, seed=3, tune=1.0)
    assert result.pods == 3
    assert result.placed == 3
    assert result.alloc_at(100) == pytest.approx(100.0)
    assert result.first_failure_arrived is None
    assert math.isnan(result.alloc_at(130))
    assert len(result.latencies_ns) == 3 and (result.latencies_ns > 0).all()


def test_replay_counts_failures_and_gpu_spec() -> None:
    """The pod that may only use an A100 can never be placed: arrived grows, used does not."""
    pods = [pod("a", 1000, spec=("T4",)), pod("x", 500, spec=("A100",))]
    result = replay(NODES, pods, Policy.BEST_FIT, seed=1, tune=0.75)
    assert result.pods == 2 and result.placed == 1
    assert result.first_failure_arrived is not None
    # Arrived ends at 1500 of 2000 (x = 75) with 1000 used: 50 %.
    assert result.alloc_at(75) == pytest.approx(50.0)


def test_replay_reports_cpu_held_and_gpu_less_refusals() -> None:
    """16 CPUs over the two nodes. The GPU pods hold 1 + 2 CPUs and the GPU-less pod that
    fits 4 more, 7 of 16 (43.75 %) once all have arrived; the GPU-less pod asking for 9 CPUs
    fits neither node. GPU-less pods do not move x: a seed whose order ends with a GPU pod,
    and has no clone, has every pod arrived at x = 100."""
    pods = [
        pod("a", 1000),
        pod("b", 1000, cpu=2000),
        pod("small", 0, cpu=4000),
        pod("huge", 0, cpu=9000),
    ]
    seed = next(
        s
        for s in range(100)
        if len(order := arrival_order(pods, s, 1.0, 2000)) == 4 and order[-1] in (0, 1)
    )
    result = replay(NODES, pods, Policy.BEST_FIT, seed=seed, tune=1.0)
    assert result.refused_gpu_less == 1
    assert result.placed == 3
    assert result.cpu_at(100) == pytest.approx(100 * 7 / 16)
    assert result.alloc_at(100) == pytest.approx(100.0)


def test_spread_and_binpack_differ_on_sharing() -> None:
    """Two 500-milli pods then a whole-GPU pod: binpack keeps one GPU free for it, spread
    puts one share on each GPU and the whole-GPU pod fails."""
    nodes = [TraceNode("n0", 8000, 32768, 2, "T4")]
    pods = [pod("s1", 500), pod("s2", 500), pod("w", 1000)]
    seed = next(s for s in range(100) if arrival_order(pods, s, 1.0, 2000)[-1] == 2)
    packed = replay(nodes, pods, Policy.BINPACK, seed=seed, tune=1.0)
    spread = replay(nodes, pods, Policy.SPREAD, seed=seed, tune=1.0)
    assert packed.alloc_at(100) == pytest.approx(100.0)
    assert spread.alloc_at(100) == pytest.approx(50.0)
    assert spread.first_failure_arrived == pytest.approx(100.0)


def test_trace_files_round_trip_and_bad_files_say_why(tmp_path: Path) -> None:
    nodes_csv, pods_csv = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    write_nodes(nodes_csv, NODES)
    pods = [pod("a", 500, spec=("T4", "V100")), pod("b", 0)]
    write_pods(pods_csv, pods)
    assert read_nodes(nodes_csv) == NODES
    assert read_pods(pods_csv) == pods
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(TraceError, match="missing column"):
        read_pods(bad)
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nx,1,1,1,1500,\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: gpu_milli=1500 is out of range"):
        read_pods(bad)
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nx,lots,1,1,100,\n")
    with pytest.raises(TraceError, match="'lots' is not an integer"):
        read_pods(bad)
    with pytest.raises(TraceError, match="cannot read"):
        read_pods(tmp_path / "missing.csv")


def test_cpu_zero_reads_as_100(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nx,0,1,1,100,\n")
    assert read_pods(path)[0].cpu_milli == 100


def test_cli_prints_one_row_per_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    write_nodes(nodes_csv, [TraceNode(f"n{i}", 16000, 65536, 2, "T4") for i in range(4)])
    write_pods(pods_csv, [pod(f"p{i}", (300, 500, 1000, 0)[i % 4]) for i in range(20)])
    code = bench_main(
        [
            "placement",
            "--nodes",
            str(nodes_csv),
            "--pods",
            str(pods_csv),
            "--seeds",
            "1-2",
            "--policy",
            "fragmentation,best-fit",
            "--json",
            str(tmp_path / "out.json"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "(4 nodes, 8 GPUs)" in out and "seeds 1,2" in out
    rows = [line for line in out.splitlines() if line.startswith(("fragmentation", "best-fit"))]
    assert len(rows) == 3  # two table rows plus the ratio line
    assert (tmp_path / "out.json").read_text().count('"policy"') == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["placement", "--seeds", "9-1"], "seeds '9-1'"),
        (["placement", "--policy", "magic"], "choose from"),
        (["placement", "--tune", "0"], "tune '0'"),
        (["nope"], "unknown command 'nope'"),
    ],
)
def test_cli_rejects_bad_arguments(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = bench_main(args)
    except SystemExit as e:
        code = int(e.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def _help_on_a_narrow_terminal(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> str:
    """The help as a 60-column terminal shows it, with line breaks folded to spaces: a
    default path longer than the help column must still come out whole (a clone at a deep
    path once had its trace path split mid-name)."""
    monkeypatch.setenv("COLUMNS", "60")
    with pytest.raises(SystemExit) as exited:
        bench_main([command, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_cli_help_names_the_policies_and_shows_every_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _help_on_a_narrow_terminal("placement", capsys, monkeypatch)
    assert "<Policy" not in out
    assert f"from {','.join(p.value for p in Policy)}" in out
    assert "(default: fragmentation,fgd,best-fit,binpack,spread)" in out
    assert f"(default: {default_path(DEFAULT_NODES)})" in out
    assert f"(default: {default_path(DEFAULT_PODS)})" in out
    assert "(default: 42-51)" in out and "(default: 1.3)" in out
    assert "TUNE x the cluster's GPU capacity" in out
    undocumented = [
        a.option_strings[0] for a in build_parser()._actions if not (a.help or "").strip()
    ]
    assert undocumented == []


def test_constraints_help_documents_every_flag_with_its_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _help_on_a_narrow_terminal("placement-constraints", capsys, monkeypatch)
    assert "<Policy" not in out
    assert f"from {','.join(p.value for p in Policy)} (default: fragmentation)" in out
    assert f"(default: {default_path(DEFAULT_NODES)})" in out
    flags = ("--nodes", "--pods", "--policy", "--fill", "--decisions", "--window", "--churn")
    for flag in (*flags, "--seed"):
        assert flag in out
    assert out.count("(default:") >= 8


def test_cli_reports_unreadable_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_main(["placement", "--nodes", str(tmp_path / "none.csv"), "--seeds", "1"])
    assert code == 2
    assert "cannot read" in capsys.readouterr().err


def test_synthetic_traces_change_what_they_say() -> None:
    pods = [pod(f"w{i}", 1000) for i in range(80)] + [pod(f"s{i}", 300) for i in range(20)]
    pods += [pod(f"c{i}", 0) for i in range(10)]
    sharing = synthesize("sharing", pods, NODES, 0.6, seed=1)
    assert sum(0 < p.gpu_milli < 1000 for p in sharing) == 60
    multi = synthesize("multi-gpu", pods, NODES, 0.3, seed=1)
    assert sum(p.num_gpu > 1 for p in multi) == 30
    models = synthesize("gpu-models", pods, NODES, 0.5, seed=1)
    assert sum(bool(p.gpu_spec) for p in models) == 50
    assert all(set(p.gpu_spec) <= {"T4", "V100"} for p in models)
    heavy = synthesize("cpu-heavy", pods, NODES, 2.0, seed=1)
    extra_cpu = sum(p.cpu_milli for p in heavy if p.num_gpu == 0)
    assert extra_cpu >= 3 * sum(p.cpu_milli for p in pods if p.num_gpu == 0)
    with pytest.raises(TraceError, match="unknown kind"):
        synthesize("other", pods, NODES, 0.5, seed=1)


def _openb_like() -> list[TracePod]:
    """A small default-like list: whole, sharing, multi-GPU and CPU-only pods."""
    pods = [pod(f"w{i}", 1000, cpu=4000) for i in range(60)]
    pods += [pod(f"s{i}", 250 + 10 * i) for i in range(30)]
    pods += [pod(f"m{i}", 1000, num_gpu=2 * (i + 1), cpu=16000) for i in range(4)]
    return pods + [pod(f"c{i}", 0, cpu=2000 + 1000 * i) for i in range(10)]


def _gpu_shapes(pods: list[TracePod]) -> list[tuple[int, int, int]]:
    return sorted((p.cpu_milli, p.num_gpu, p.gpu_milli) for p in pods if p.num_gpu)


def _wide_share(pods: list[TracePod]) -> float:
    """The multi-GPU pods' share of the GPU request."""
    return sum(p.gpu_request for p in pods if p.num_gpu > 1) / sum(p.gpu_request for p in pods)


def test_openb_cpu_makes_cpu_only_pods_the_share_asked_and_keeps_gpu_pods() -> None:
    pods = _openb_like()
    out = synthesize("openb-cpu", pods, NODES, 0.25, seed=1)
    gpu = [p for p in pods if p.num_gpu]
    assert sum(p.num_gpu == 0 for p in out) == round(0.25 / 0.75 * len(gpu))
    assert _gpu_shapes(out) == _gpu_shapes(gpu)
    cpu_shapes = {p.cpu_milli for p in pods if p.num_gpu == 0}
    assert {p.cpu_milli for p in out if p.num_gpu == 0} <= cpu_shapes
    assert len({p.name for p in out}) == len(out)


def test_openb_gpushare_redraws_gpu_pods_with_the_sharing_share_asked() -> None:
    pods = _openb_like()
    for fraction in (0.0, 0.6, 1.0):
        out = synthesize("openb-gpushare", pods, NODES, fraction, seed=2)
        gpu = [p for p in out if p.num_gpu]
        assert len(gpu) == sum(p.num_gpu > 0 for p in pods)
        assert sum(0 < p.gpu_milli < 1000 for p in gpu) == round(fraction * len(gpu))
        assert sum(p.num_gpu == 0 for p in out) == 10


def test_openb_multigpu_adds_wide_pods_until_they_hold_the_share_of_gpus() -> None:
    pods = _openb_like()
    out = synthesize("openb-multigpu", pods, NODES, 0.5, seed=3)
    assert [(p.cpu_milli, p.gpu_request) for p in out[: len(pods)]] == [
        (p.cpu_milli, p.gpu_request) for p in pods
    ]
    added = out[len(pods) :]
    assert added and all(p.num_gpu > 1 for p in added)
    assert _wide_share(out) >= 0.5 > _wide_share(out[:-1])


def test_openb_gpuspec_limits_the_share_asked_to_production_model_sets() -> None:
    pods = _openb_like()
    out = synthesize("openb-gpuspec", pods, NODES, 0.5, seed=4)
    limited = [p for p in out if p.gpu_spec]
    assert len(limited) == int(0.5 * sum(p.num_gpu > 0 for p in pods))
    assert all(p.num_gpu > 0 for p in limited)
    assert {p.gpu_spec for p in limited} <= {models for models, _ in GPUSPEC_FREQUENCY}
    assert sum(count for _, count in GPUSPEC_FREQUENCY) == 2388  # the limited pods of gpuspec33


@pytest.mark.parametrize(
    ("kind", "pods", "fraction", "message"),
    [
        ("openb-cpu", [pod("w", 1000)], 0.2, "needs CPU-only pods"),
        ("openb-cpu", [pod("w", 1000), pod("c", 0)], 1.0, r"--fraction 1.0 is a share: .*\[0, 1\)"),
        ("openb-cpu", [pod("w", 1000), pod("c", 0)], 0.96, "would write 25 pods, more than 10 x"),
        ("openb-multigpu", [pod("w", 1000)], 0.3, "needs multi-GPU pods"),
        ("openb-multigpu", [pod("m", 1000, num_gpu=2)], 1.0, r"use a number in \[0, 1\)"),
        ("openb-multigpu", [pod("w", 1000), pod("m", 1000, num_gpu=2)], 0.99, "more than 10 x"),
        ("openb-gpushare", [pod("w", 1000), pod("v", 1000)], 0.5, "needs sharing pods"),
        ("openb-gpushare", [pod("s", 300)], 0.0, "needs whole-GPU or multi-GPU pods"),
        ("openb-gpushare", [pod("s", 300)], 2.0, r"use a number in \[0, 1\]"),
        ("openb-gpuspec", [pod("c", 0)], 0.5, "needs GPU pods"),
    ],
)
def test_openb_kinds_say_what_is_wrong_and_what_is_allowed(
    kind: str, pods: list[TracePod], fraction: float, message: str
) -> None:
    with pytest.raises(TraceError, match=message):
        synthesize(kind, pods, NODES, fraction, seed=1)


def test_pod_lists_without_gpu_spec_are_read_as_any_model(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1000,1,1,500\n")
    assert read_pods(path) == [TracePod("x", 1000, 1, 1, 500, ())]


def test_replay_reports_the_first_whole_node_refusal() -> None:
    """Two 2-GPU nodes. Spread puts the two shares on both nodes, so the 2-GPU pod arriving
    last is refused; binpack stacks them on one GPU and it fits. The 2-GPU pod asking more
    CPU than any node has is refused too, but could never fit: it is not counted."""
    nodes = [TraceNode(f"n{i}", 8000, 32768, 2, "T4") for i in range(2)]
    pods = [pod("s1", 500), pod("s2", 500), pod("big", 1000, num_gpu=2)]
    never = pod("huge", 1000, num_gpu=2, cpu=64000)
    seed = next(s for s in range(100) if arrival_order(pods, s, 0.75, 4000)[-1] == 2)
    spread = replay(nodes, [*pods, never], Policy.SPREAD, seed=seed, tune=0.75)
    assert spread.first_big_failure_arrived is not None
    packed = replay(nodes, pods, Policy.BINPACK, seed=seed, tune=0.75)
    assert packed.first_big_failure_arrived is None
    alone = replay(nodes, [pod("s1", 500), never], Policy.BINPACK, seed=1, tune=0.5)
    assert alone.first_failure_arrived is not None
    assert alone.first_big_failure_arrived is None
    # Over both runs, the one that never refused counts at the end of its run (all that
    # arrived, at most tune x capacity), not left out of the mean.
    both = summarize(Policy.BINPACK, [spread, packed])
    assert both.big_never_refused == 1
    assert both.first_big_failure.mean == pytest.approx(spread.first_big_failure_arrived)
    order = arrival_order(pods, seed, 0.75, 4000)
    assert packed.arrived_at_end == pytest.approx(
        100 * sum(pods[i].gpu_request for i in order) / 4000
    )
    expected = (spread.first_big_failure_arrived + packed.arrived_at_end) / 2
    assert both.big_refusal_or_end.mean == pytest.approx(expected)
    assert big_refusal_or_end(spread) == spread.first_big_failure_arrived


def test_cli_compares_fgd_with_its_published_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes_csv = tmp_path / "openb_node_list_gpu_node.csv"
    pods_csv = tmp_path / "openb_pod_list_default.csv"
    write_nodes(nodes_csv, [TraceNode(f"n{i}", 16000, 65536, 8, "T4") for i in range(4)])
    write_pods(pods_csv, [pod(f"p{i}", (300, 500, 1000, 0)[i % 4]) for i in range(40)])
    args = ["placement", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--seeds", "1"]
    assert bench_main(args) == 0
    out = capsys.readouterr().out
    assert "at 1st 8-GPU refusal" in out
    rows = [line.split()[0] for line in out.splitlines()[3:8]]
    assert rows == ["fragmentation", "fgd", "best-fit", "binpack", "spread"]
    assert "vs 95.23 % published" in out


def test_constraints_bench_times_every_pod_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes_csv, pods_csv = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    models = ("T4", "V100")
    write_nodes(nodes_csv, [TraceNode(f"n{i}", 64000, 262144, 8, models[i % 2]) for i in range(12)])
    write_pods(pods_csv, [pod(f"p{i}", (300, 500, 1000, 0)[i % 4]) for i in range(40)])
    args = ["--nodes", str(nodes_csv), "--pods", str(pods_csv), "--decisions", "6"]
    code = bench_main(["placement-constraints", *args, "--churn", "10", "--window", "4"])
    out = capsys.readouterr().out
    assert code == 0
    shapes = ("plain", "nodeSelector", "required affinity", "tolerations", "GPU model", "multi")
    for shape in shapes:
        rows = [line for line in out.splitlines() if line.startswith(shape)]
        assert rows and all(" 6/6 " in row for row in rows), (shape, out)
    assert "worst CPU p99" in out
    # 48 decisions, a churn every 10: four decisions came right after one.
    assert "first decision after a node churn (4 churns): CPU median" in out
