import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fracgpu.codec import (
    decode_assignment,
    decode_devices,
    decode_quota,
    decode_reservation,
    encode_assignment,
    encode_device,
    encode_quota_spec,
    encode_quota_status,
    encode_reservation,
)
from fracgpu.errors import CodecError
from fracgpu.model import (
    Assignment,
    ContainerAssignment,
    GPUAllocation,
    GPUDevice,
    Grants,
    Priority,
    Quota,
    Reservation,
    ResourceAmounts,
    ResourceLimits,
)

names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30
)
allocations = st.builds(GPUAllocation, names, st.integers(0, 100), st.integers(0, 2**40))


@st.composite
def containers(draw: st.DrawFn) -> ContainerAssignment:
    devices = tuple(draw(st.lists(allocations, min_size=1, max_size=4)))
    held = max(1, *(d.cores for d in devices))
    core_limit = draw(st.none() | st.integers(held, 100))
    return ContainerAssignment(draw(names), devices, core_limit)


assignments = st.builds(
    Assignment,
    names,
    names,
    st.lists(containers(), max_size=4, unique_by=lambda c: c.container).map(tuple),
    memory_scaling=st.just(1.0) | st.floats(1.0, 16.0),
    compute_limit=st.booleans(),
)
devices = st.builds(
    GPUDevice,
    names,
    st.integers(0, 1023),
    names,
    st.integers(1, 2**40),
    st.booleans(),
    st.booleans(),
    st.text(max_size=16),
)
reservations = st.builds(
    Reservation,
    names,
    names,
    names,
    st.text(max_size=20),
    st.lists(allocations, max_size=4).map(tuple),
    st.integers(0, 2**37),
)
amount = st.integers(0, 2**50)
limits = st.builds(ResourceLimits, st.none() | amount, st.none() | amount, st.none() | amount)
amounts = st.builds(ResourceAmounts, amount, amount, amount)
quotas = st.builds(
    Quota,
    names,
    names,
    limits,
    st.dictionaries(names, limits, max_size=3),
    st.lists(names, max_size=3).map(tuple),
    amounts,
    st.dictionaries(names, amounts, max_size=3),
    st.just(""),
    grants=st.builds(Grants, st.sampled_from(Priority), st.booleans()),
)


ascii_names = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), min_size=1)


@given(assignments)
def test_assignment_round_trips(assignment: Assignment) -> None:
    text = encode_assignment(assignment)
    assert decode_assignment(text) == assignment
    # The same text as ever (pods already admitted carry it): compact, keys sorted.
    assert text == json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)


@given(
    st.builds(
        Assignment,
        ascii_names,
        ascii_names,
        st.lists(containers(), max_size=3, unique_by=lambda c: c.container).map(tuple),
        memory_scaling=st.floats(1.0, 16.0),
        compute_limit=st.booleans(),
    )
)
def test_assignment_text_is_what_earlier_versions_wrote(assignment: Assignment) -> None:
    # ASCII names with control characters, and any scaling: the fast encoder's text is the
    # one json.dumps wrote, byte for byte, so pods admitted before an upgrade still validate.
    payload = json.loads(encode_assignment(assignment))
    assert encode_assignment(assignment) == json.dumps(
        payload, separators=(",", ":"), sort_keys=True
    )


@given(st.lists(devices, max_size=8, unique_by=lambda d: d.uuid))
def test_devices_round_trip(items: list[GPUDevice]) -> None:
    payload = json.loads(json.dumps([encode_device(d) for d in items]))
    assert decode_devices("status.devices", payload) == tuple(items)


@given(reservations)
def test_reservation_round_trips(reservation: Reservation) -> None:
    payload = json.loads(json.dumps(encode_reservation(reservation)))
    assert decode_reservation("reservation", payload, reservation.node) == reservation


@given(quotas)
def test_quota_round_trips(quota: Quota) -> None:
    obj = {
        "apiVersion": "fracgpu.io/v1alpha1",
        "kind": "GPUQuota",
        "metadata": {"name": quota.name, "namespace": quota.namespace},
        "spec": encode_quota_spec(quota),
        "status": encode_quota_status(quota),
    }
    assert decode_quota(json.loads(json.dumps(obj))) == quota


def _corruptions(payload: dict[str, Any]) -> list[Any]:
    """Ways to break a valid assignment payload, each of which must be rejected."""
    out: list[Any] = []
    optional = {"memoryScaling", "computeLimit"}  # absent means the default: not corrupt
    for key, value in payload.items():
        if key not in optional:
            dropped = dict(payload)
            del dropped[key]
            out.append(dropped)
        for wrong in (None, True, "x", 1.5, [], {}):
            if type(wrong) is not type(value):
                out.append({**payload, key: wrong})
    out.append({**payload, "extra": 1})
    out.append({**payload, "version": 2})
    out.append({**payload, "version": 0})
    out.append([payload])
    return out


@given(assignments.filter(lambda a: bool(a.containers)))
def test_corrupted_assignments_are_rejected(assignment: Assignment) -> None:
    payload = json.loads(encode_assignment(assignment))
    for broken in _corruptions(payload):
        with pytest.raises(CodecError):
            decode_assignment(json.dumps(broken))
    device = payload["containers"][0]["devices"][0]
    for key, bad in (("cores", 101), ("cores", -1), ("memoryMiB", -1), ("uuid", ""), ("x", 1)):
        device_copy = {**device, key: bad}
        broken = json.loads(json.dumps(payload))
        broken["containers"][0]["devices"][0] = device_copy
        with pytest.raises(CodecError):
            decode_assignment(json.dumps(broken))


def test_default_settings_are_left_out_of_the_annotation() -> None:
    plain = Assignment("n", "r", (ContainerAssignment("a", (GPUAllocation("u", 30, 1024),)),))
    text = encode_assignment(plain)
    assert "memoryScaling" not in text and "computeLimit" not in text and "coreLimit" not in text
    tuned = Assignment(
        "n",
        "r",
        (ContainerAssignment("a", (GPUAllocation("u", 30, 1024),), core_limit=60),),
        memory_scaling=1.5,
        compute_limit=False,
    )
    payload = json.loads(encode_assignment(tuned))
    assert payload["memoryScaling"] == 1.5
    assert payload["computeLimit"] is False
    assert payload["containers"][0]["coreLimit"] == 60


@given(st.text(max_size=200))
def test_arbitrary_text_is_rejected_cleanly(text: str) -> None:
    try:
        decode_assignment(text)
    except CodecError as error:
        assert "assignment annotation" in str(error)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "assignment annotation: is not JSON"),
        (
            '{"version": 9, "node": "n", "reservationId": "r", "containers": []}',
            "version 9 is not supported: use 1",
        ),
        ('{"version": 1, "node": "n", "reservationId": "r"}', "is missing containers"),
        (
            '{"version": true, "node": "n", "reservationId": "r", "containers": []}',
            "version must be int, not bool",
        ),
        (
            '{"version": 1, "node": "n", "reservationId": "r", "containers": [], "x": 1}',
            "has unknown field(s) x: allowed are computeLimit, containers, memoryScaling, node, "
            "reservationId, version",
        ),
        (
            '{"version": 1, "node": "n", "reservationId": "r", "containers": [], '
            '"memoryScaling": 0.5}',
            "memoryScaling=0.5 is out of range: use 1 to 16",
        ),
        (
            '{"version": 1, "node": "n", "reservationId": "r", "containers": [], '
            '"memoryScaling": "2"}',
            "memoryScaling must be a number, not str",
        ),
        (
            '{"version": 1, "node": "n", "reservationId": "r", "containers": [], '
            '"computeLimit": 0}',
            "computeLimit must be bool, not int",
        ),
        (
            '{"version": 1, "node": "n", "reservationId": "r", "containers": '
            '[{"name": "a", "coreLimit": 20, "devices": [{"uuid": "u", "cores": 30, '
            '"memoryMiB": 1}]}]}',
            "coreLimit=20 is below the cores it holds",
        ),
        (
            '{"version": 1, "node": "n", "reservationId": "r", "containers": '
            '[{"name": "a", "coreLimit": 101, "devices": [{"uuid": "u", "cores": 30, '
            '"memoryMiB": 1}]}]}',
            "coreLimit=101 is out of range: use 1-100",
        ),
        (
            '{"version": 1, "node": "n", "reservationId": "r", "containers": '
            '[{"name": "a", "devices": []}]}',
            "has no devices",
        ),
        ("[" * 100000 + "]" * 100000, "is larger than 65536 bytes"),
    ],
)
def test_rejection_messages(text: str, message: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_assignment(text)
    assert message in str(info.value)


def test_duplicate_containers_and_devices_are_rejected() -> None:
    alloc = GPUAllocation("GPU-1", 10, 256)
    twice = Assignment("n", "r", (ContainerAssignment("a", (alloc,)),) * 2)
    with pytest.raises(CodecError, match="names a container twice"):
        decode_assignment(encode_assignment(twice))
    dev = encode_device(GPUDevice("GPU-1", 0, "T4", 15360))
    with pytest.raises(CodecError, match="lists a GPU UUID twice"):
        decode_devices("status.devices", [dev, dev])


def test_quota_rejects_bad_spec() -> None:
    obj = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"cores": -1}}}
    with pytest.raises(CodecError, match=r"GPUQuota ns/q spec.hard: cores=-1 is out of range"):
        decode_quota(obj)
    obj = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"gpu": 1}}}
    with pytest.raises(CodecError, match="unknown field"):
        decode_quota(obj)


def test_reservation_times_are_rfc3339() -> None:
    reservation = Reservation("r1", "node-a", "ns", "", (), 1_800_000_000)
    payload = encode_reservation(reservation)
    assert payload["expiresAt"] == "2027-01-15T08:00:00Z"
    with pytest.raises(CodecError, match="is not an RFC 3339 time"):
        decode_reservation("r", {**payload, "expiresAt": "tomorrow"}, "node-a")
    with pytest.raises(CodecError, match="has no time zone"):
        decode_reservation("r", {**payload, "expiresAt": "2027-01-15T08:00:00"}, "node-a")
