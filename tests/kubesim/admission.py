"""What the API server does to a body before it stores it: validation against the official OpenAPI schema of its
version (kubernetes-validate), then the defaults the docs give.

- Field validation (https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation): an object the
  schema refuses is 422 Invalid with the field in ``details.causes``; a field the schema does not know is 400
  BadRequest under ``Strict``, a warning under ``Warn``, ignored under ``Ignore``.
- Jobs (https://kubernetes.io/docs/concepts/workloads/controllers/job/): the selector is generated from the Job's
  uid and the template gets the labels ``batch.kubernetes.io/controller-uid`` and ``batch.kubernetes.io/job-name``
  (and their legacy names); ``backoffLimit`` is 6, or the largest int32 when ``backoffLimitPerIndex`` is set;
  ``completionMode`` NonIndexed, ``parallelism`` 1, ``suspend`` false; with a ``podFailurePolicy`` the
  ``podReplacementPolicy`` is Failed (a replacement waits until the pod it replaces is terminal).
- Pods (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/): phase Pending; restartPolicy Always;
  terminationGracePeriodSeconds 30.
"""

from __future__ import annotations

import uuid
from typing import Any

from kubesim.store import ApiError

INT32_MAX = 2147483647


def admit(resource: str, body: dict[str, Any], version: str, validation: str) -> str | None:
    """Validate ``body`` (raise ApiError) and fill in its defaults in place; return a warning, where one is due."""
    warning = _validate(body, version, validation)
    meta = body.setdefault("metadata", {})
    for server_owned in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generation"):
        meta.pop(server_owned, None)
    meta["uid"] = str(uuid.uuid4())
    if resource == "jobs":
        _job_defaults(body)
    elif resource == "pods":
        _pod_defaults(body)
    elif resource == "services":
        spec = body.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
    return warning


def check(body: dict[str, Any], version: str, validation: str) -> str | None:
    """Validate a changed object (a patch's result) as a created one (raise ApiError; a warning, where one is due);
    no defaults, the server's fields kept."""
    return _validate(body, version, validation)


def _validate(body: dict[str, Any], version: str, validation: str) -> str | None:
    import kubernetes_validate

    name = body.get("metadata", {}).get("name") or body.get("metadata", {}).get("generateName") or ""
    group = str(body.get("apiVersion")).rpartition("/")[0]
    described = f'{body.get("kind")}{"." + group if group else ""}'
    try:
        kubernetes_validate.validate(body, version, strict=False)
    except kubernetes_validate.ValidationError as exc:
        field = ".".join(str(part) for part in exc.absolute_path)
        message = f'{described} "{name}" is invalid: {field}: Invalid value: {exc.message}'
        raise ApiError(422, "Invalid", message, {"name": name, "kind": body.get("kind"), "causes": [
            {"reason": "FieldValueInvalid", "message": f"Invalid value: {exc.message}", "field": field}]}) from None
    if validation == "Ignore":
        return None
    try:
        kubernetes_validate.validate(body, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        field = ".".join(str(part) for part in exc.absolute_path)
        unknown = f'unknown field "{field}": {exc.message}'
        if validation == "Strict":
            raise ApiError(400, "BadRequest", f"strict decoding error: {unknown}") from None
        return unknown
    return None


def _job_defaults(body: dict[str, Any]) -> None:
    meta, spec = body["metadata"], body.setdefault("spec", {})
    uid = meta["uid"]
    own = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": meta["name"],
           "controller-uid": uid, "job-name": meta["name"]}
    spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    spec["manualSelector"] = spec.get("manualSelector", False)
    template_meta = spec["template"].setdefault("metadata", {})
    template_meta["labels"] = {**template_meta.get("labels", {}), **own}
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("backoffLimit", INT32_MAX if spec.get("backoffLimitPerIndex") is not None else 6)
    spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
    _pod_spec_defaults(spec["template"]["spec"])
    body["status"] = {}


def _pod_defaults(body: dict[str, Any]) -> None:
    _pod_spec_defaults(body.setdefault("spec", {}))
    body["status"] = {"phase": "Pending", "qosClass": "BestEffort"}


def _pod_spec_defaults(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    for container in spec.get("containers", []):
        image = container.get("image", "")
        tagged = "@" in image or ":" in image.rsplit("/", 1)[-1]
        latest = not tagged or image.endswith(":latest")
        # https://kubernetes.io/docs/concepts/containers/images/#imagepullpolicy-defaulting
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
