from hypothesis import given
from hypothesis import strategies as st

from fracgpu import quota
from fracgpu.model import GPUAllocation, Quota, ResourceAmounts, ResourceLimits

SHARE = GPUAllocation("GPU-a", 30, 4096)
WHOLE = GPUAllocation("GPU-b", 100, 16384)
MODELS = {"GPU-a": "Tesla T4", "GPU-b": "NVIDIA A100-SXM4-80GB"}


def test_cost_counts_cores_memory_and_whole_gpus() -> None:
    assert quota.cost([SHARE, WHOLE]) == ResourceAmounts(130, 20480, 1)
    assert quota.cost_by_model([SHARE, WHOLE], MODELS) == {
        "Tesla T4": ResourceAmounts(30, 4096, 0),
        "NVIDIA A100-SXM4-80GB": ResourceAmounts(100, 16384, 1),
    }


def test_within_quota_is_allowed() -> None:
    q = Quota("team", "gpu", ResourceLimits(cores=200, memory_mib=32768, gpus=1))
    assert quota.check(q, quota.cost([SHARE, WHOLE]), {}) is None


def test_over_quota_message_names_quota_ask_used_and_allowed() -> None:
    q = Quota("team", "gpu", ResourceLimits(cores=200), used=ResourceAmounts(cores=180))
    message = quota.check(q, ResourceAmounts(cores=30), {})
    assert message == (
        'GPUQuota "team/gpu": this pod asks for 30 cores (vcuda-core), 180 of 200 are used, '
        "so at most 20 more are allowed"
    )


def test_whole_gpu_and_memory_limits() -> None:
    q = Quota("team", "gpu", ResourceLimits(gpus=0))
    assert "asks for 1 whole GPUs, 0 of 0 are used" in str(quota.check(q, quota.cost([WHOLE]), {}))
    q = Quota("team", "gpu", ResourceLimits(memory_mib=4000))
    assert "4096 GPU memory MiB" in str(quota.check(q, quota.cost([SHARE]), {}))


def test_per_model_limits_match_the_way_users_write_models() -> None:
    q = Quota("team", "gpu", hard_by_model={"A100": ResourceLimits(gpus=0)})
    ask = quota.cost_by_model([WHOLE], MODELS)
    message = quota.check(q, quota.cost([WHOLE]), ask)
    assert message is not None
    assert message.startswith('GPUQuota "team/gpu" for GPU model NVIDIA A100-SXM4-80GB:')
    # a T4 slice is not limited by the A100 entry
    assert quota.check(q, quota.cost([SHARE]), quota.cost_by_model([SHARE], MODELS)) is None


amounts = st.builds(
    ResourceAmounts, st.integers(0, 10**6), st.integers(0, 10**9), st.integers(0, 64)
)


@given(amounts, amounts)
def test_charge_then_refund_restores_used(used: ResourceAmounts, ask: ResourceAmounts) -> None:
    by_model = {"T4": used} if used != ResourceAmounts() else {}  # zero entries are dropped
    q = Quota("ns", "q", used=used, used_by_model=by_model)
    charged = quota.charge(q, ask, {"T4": ask})
    assert charged.used == used + ask
    assert quota.refund(charged, ask, {"T4": ask}) == q
