"""The pod-door checks read hostile pod specs: any JSON shape gives findings or a
``PodShapeError`` naming the path, never another exception (which would be a 500)."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.admission import grants, shimguard
from webhook.rules import pod as podlib
from webhook.settings import DEFAULT_PROTECTED_HOST_PATHS

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
paths = st.sampled_from(["/", "/etc/ld.so.preload", "//var/lib/", "x/../..", "", "/run/fracgpu"])
json_values = st.recursive(
    scalars | paths,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


def shaped(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right shape, sometimes anything."""
    return value | json_values


mount = st.fixed_dictionaries({"name": shaped(st.text(max_size=4)), "mountPath": shaped(paths)})
device = st.fixed_dictionaries({"name": shaped(st.text(max_size=4)), "devicePath": shaped(paths)})
context = st.fixed_dictionaries(
    {},
    optional={
        "privileged": shaped(st.booleans()),
        "capabilities": shaped(
            st.fixed_dictionaries(
                {"add": shaped(st.lists(shaped(st.sampled_from(["SYS_ADMIN", "cap_all"]))))}
            )
        ),
    },
)
container = st.fixed_dictionaries(
    {"name": shaped(st.sampled_from(["main", "side"]))},
    optional={
        "volumeMounts": shaped(st.lists(shaped(mount), max_size=3)),
        "volumeDevices": shaped(st.lists(shaped(device), max_size=2)),
        "securityContext": shaped(context),
    },
)
volume = st.fixed_dictionaries(
    {"name": st.text(max_size=4)},
    optional={"hostPath": shaped(st.fixed_dictionaries({"path": shaped(paths)}))},
)
spec = st.fixed_dictionaries(
    {},
    optional={
        "hostPID": shaped(st.booleans()),
        "volumes": shaped(st.lists(shaped(volume), max_size=3)),
        **{field: shaped(st.lists(shaped(container), max_size=3)) for field in podlib.ALL_FIELDS},
    },
)
pods = st.fixed_dictionaries(
    {"spec": shaped(spec)},
    optional={"metadata": shaped(st.fixed_dictionaries({"annotations": json_values}))},
)


@settings(max_examples=400, deadline=None)
@given(pods)
def test_hostile_pod_specs_give_findings_or_a_shape_error(pod: dict[str, Any]) -> None:
    try:
        hosts = shimguard.host_path_findings(pod, DEFAULT_PROTECTED_HOST_PATHS)
        mounts, privileges = shimguard.container_findings(pod, lambda name: name == "main")
    except podlib.PodShapeError as error:
        assert str(error).startswith("pod .")  # names the path that is wrong
        return
    for finding in (*hosts, *mounts, *privileges):
        assert finding.startswith(".spec.")
    if hosts:
        assert "reaches" in shimguard.host_path_denial(hosts, DEFAULT_PROTECTED_HOST_PATHS)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["fracgpu.io/priority", "nvidia.com/priority", "x"]), st.text(max_size=4)
    )
)
def test_priority_asks_read_any_annotations(annotations: dict[str, str]) -> None:
    asks = grants.high_priority_asks(annotations, (), "nvidia.com/priority")
    high = annotations.get("fracgpu.io/priority")
    expected = high == "high" if high is not None else annotations.get("nvidia.com/priority") == "0"
    assert bool(asks) is expected
