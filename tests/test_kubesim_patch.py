"""The simulation's PATCH (tests/kubesim/patch.py) on its own: JSON Patch (RFC 6902), JSON Merge Patch (RFC 7386,
the RFC's own example), strategic merge patch driven by the official schema's patch strategies and merge keys,
and what the API server does not let a patch change. The server side, through the kubernetes client and kubectl,
is in tests/test_kubesim.py."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("kubernetes_validate")

from kubesim.patch import (DEFINITIONS, JSON_PATCH, MERGE_PATCH, STRATEGIC, _definition, merge_patch,  # noqa: E402
                           patched, strategic_merge)
from kubesim.store import ApiError  # noqa: E402

VERSION = "1.31"


def pod() -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u-1", "resourceVersion": "7",
                         "labels": {"app": "a", "tier": "t"}, "finalizers": ["x/one"],
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j-1"}]},
            "spec": {"restartPolicy": "Never", "tolerations": [{"key": "k", "operator": "Exists"}],
                     "containers": [{"name": "main", "image": "img:1", "env": [{"name": "A", "value": "1"}]},
                                    {"name": "side", "image": "side:1"}]},
            "status": {"phase": "Running"}}


def test_the_rfc_7386_example():
    target = {"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"}, "tags": ["example", "sample"],
              "content": "This will be unchanged"}
    patch = {"title": "Hello!", "phoneNumber": "+01-123-456-7890", "author": {"familyName": None}, "tags": ["example"]}
    assert merge_patch(target, patch) == {"title": "Hello!", "author": {"givenName": "John"}, "tags": ["example"],
                                          "content": "This will be unchanged", "phoneNumber": "+01-123-456-7890"}


def test_a_merge_patch_replaces_lists_and_removes_nulls():
    result = patched(pod(), {"metadata": {"labels": {"tier": None, "new": "n"}, "finalizers": ["x/two"]}},
                     MERGE_PATCH, "Pod", VERSION)
    assert result["metadata"]["labels"] == {"app": "a", "new": "n"}
    assert result["metadata"]["finalizers"] == ["x/two"]  # a list is replaced whole


def test_a_strategic_merge_patch_merges_lists_by_their_merge_key():
    # the merge itself (a Pod's API would refuse this spec change: see test_what_a_patch_cannot_change)
    result = strategic_merge(pod(), {
        "metadata": {"finalizers": ["x/two"], "$deleteFromPrimitiveList/finalizers": ["x/one"]},
        "spec": {"containers": [{"name": "main", "image": "img:2", "env": [{"name": "B", "value": "2"}]},
                                {"name": "side", "$patch": "delete"}],
                 "$setElementOrder/containers": [{"name": "main"}]}}, _definition(DEFINITIONS["Pod"], VERSION),
        VERSION)
    assert result["metadata"]["finalizers"] == ["x/two"]
    (main,) = result["spec"]["containers"]
    assert main["image"] == "img:2" and main["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert result["spec"]["tolerations"] == [{"key": "k", "operator": "Exists"}]
    # through the server's rules: what a Pod may change
    owner = {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "n-1"}
    allowed = patched(pod(), {"metadata": {"ownerReferences": [owner]},
                              "spec": {"containers": [{"name": "side", "image": "side:2"}]}}, STRATEGIC, "Pod", VERSION)
    assert [ref["uid"] for ref in allowed["metadata"]["ownerReferences"]] == ["j-1", "n-1"]
    assert [c["image"] for c in allowed["spec"]["containers"]] == ["img:1", "side:2"]


def test_a_strategic_merge_patch_replaces_an_atomic_list_and_needs_merge_keys():
    result = patched(pod(), {"spec": {"tolerations": [{"key": "k", "operator": "Exists"},
                                                      {"key": "g", "operator": "Exists"}]}}, STRATEGIC, "Pod", VERSION)
    assert [t["key"] for t in result["spec"]["tolerations"]] == ["k", "g"]  # x-kubernetes-list-type atomic
    with pytest.raises(ApiError, match="does not contain declared merge key: name"):
        patched(pod(), {"spec": {"containers": [{"image": "x"}]}}, STRATEGIC, "Pod", VERSION)


def test_a_json_patch():
    result = patched(pod(), [{"op": "test", "path": "/metadata/labels/app", "value": "a"},
                             {"op": "add", "path": "/metadata/labels/x~1y", "value": "z"},
                             {"op": "remove", "path": "/metadata/finalizers/0"},
                             {"op": "replace", "path": "/spec/containers/1/image", "value": "side:2"},
                             {"op": "copy", "from": "/metadata/labels/app", "path": "/metadata/labels/copy"}],
                     JSON_PATCH, "Pod", VERSION)
    assert result["metadata"]["labels"] == {"app": "a", "tier": "t", "x/y": "z", "copy": "a"}
    assert result["metadata"]["finalizers"] == [] and result["spec"]["containers"][1]["image"] == "side:2"
    with pytest.raises(ApiError, match="testing value /metadata/labels/app failed"):
        patched(pod(), [{"op": "test", "path": "/metadata/labels/app", "value": "b"}], JSON_PATCH, "Pod", VERSION)


def test_what_a_patch_cannot_change():
    kept = patched(pod(), {"metadata": {"name": "q", "uid": "other"}, "status": {"phase": "Failed"}}, MERGE_PATCH,
                   "Pod", VERSION)
    assert (kept["metadata"]["name"], kept["metadata"]["uid"], kept["status"]) == ("p", "u-1", {"phase": "Running"})
    with pytest.raises(ApiError) as stale:
        patched(pod(), {"metadata": {"resourceVersion": "6", "labels": {"a": "b"}}}, MERGE_PATCH, "Pod", VERSION)
    assert stale.value.code == 409
    with pytest.raises(ApiError, match="pod updates may not change fields other than") as forbidden:
        patched(pod(), {"spec": {"restartPolicy": "Always"}}, MERGE_PATCH, "Pod", VERSION)
    assert forbidden.value.code == 422
    with pytest.raises(ApiError, match="only additions to existing tolerations"):
        patched(pod(), {"spec": {"tolerations": []}}, MERGE_PATCH, "Pod", VERSION)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "uid": "j-1", "resourceVersion": "3"},
           "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "template": {"spec": {}}}}
    with pytest.raises(ApiError, match=r'Job "j" is invalid: spec.template: Invalid value: field is immutable'):
        patched(job, {"spec": {"template": {"metadata": {"labels": {"a": "b"}}}}}, STRATEGIC, "Job", VERSION)
    with pytest.raises(ApiError, match="spec.completions"):
        patched(job, {"spec": {"completions": 3}}, MERGE_PATCH, "Job", VERSION)
    scaled = patched(copy.deepcopy(job), {"spec": {"completions": 3, "parallelism": 3}}, MERGE_PATCH, "Job", VERSION)
    assert scaled["spec"]["completions"] == 3  # an elastic Indexed Job
    with pytest.raises(ApiError) as unsupported:
        patched(pod(), {}, "application/apply-patch+yaml", "Pod", VERSION)
    assert unsupported.value.code == 415
