"""PATCH of a stored object, as https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/
and .../reference/using-api/api-concepts/#patch-and-apply describe it, by the request's Content-Type:

- ``application/json-patch+json``: a JSON Patch (RFC 6902): add, remove, replace, move, copy, test.
- ``application/merge-patch+json``: a JSON Merge Patch (RFC 7386): maps merge, ``null`` removes a key, any other
  value (a list included) replaces.
- ``application/strategic-merge-patch+json``: as a merge patch, except for lists whose field declares
  ``x-kubernetes-patch-strategy: merge`` in the official OpenAPI schema (the Go types' ``patchStrategy``): a list of
  objects merges item by item on its ``x-kubernetes-patch-merge-key`` (``containers`` by ``name``,
  ``ownerReferences`` by ``uid``), an item ``{"$patch": "delete", KEY: ...}`` removes one; a list of scalars
  (``finalizers``) takes the union, ``$deleteFromPrimitiveList/FIELD`` removes values; ``{"$patch": "replace"}``
  replaces a map, ``{"$patch": "delete"}`` removes it. ``$setElementOrder/FIELD`` (an order for the merged list,
  which kubectl apply sends) is accepted and not applied; ``$retainKeys`` is applied to the patched map.
  (``application/apply-patch+yaml``, server-side apply, is not simulated: 415.)

What a patch may change follows the API server's validation: a resourceVersion in the patch must be the stored one
(409 Conflict); name, namespace, uid and creationTimestamp stay the server's; status is not changed through the
object (its ``/status`` subresource is the way); a Pod's spec may change only in its containers' images,
``activeDeadlineSeconds``, ``terminationGracePeriodSeconds`` and tolerations added ("pod updates may not change
fields other than ..."); a Job's ``spec.template``, ``spec.selector`` and ``spec.completionMode`` are immutable
(a Job's docs: "Job's pod template is immutable"), ``completions`` changes only together with ``parallelism``
(elastic Indexed Jobs). The result is checked against the schema as a created object is.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any

from kubesim.store import ApiError

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
DEFINITIONS = {"Pod": "io.k8s.api.core.v1.Pod", "Service": "io.k8s.api.core.v1.Service",
               "Event": "io.k8s.api.core.v1.Event", "Secret": "io.k8s.api.core.v1.Secret",
               "Namespace": "io.k8s.api.core.v1.Namespace", "Job": "io.k8s.api.batch.v1.Job"}
SERVER_OWNED = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generateName")


def patched(current: dict[str, Any], patch: Any, content_type: str, kind: str, version: str) -> dict[str, Any]:
    """The object ``current`` with ``patch`` applied; ApiError as the API server answers a patch it refuses."""
    content_type = content_type.split(";")[0].strip()
    if content_type == JSON_PATCH:
        result = json_patch(current, patch)
    elif content_type == MERGE_PATCH:
        result = merge_patch(current, patch)
    elif content_type == STRATEGIC:
        result = strategic_merge(current, patch, _definition(DEFINITIONS[kind], version), version)
    else:
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted "
                                                    f"media types include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC}")
    if not isinstance(result, dict):
        raise ApiError(400, "BadRequest", "the patch did not give an object")
    wanted = (result.get("metadata") or {}).get("resourceVersion")
    if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
        raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.lower()}s '
                                        f'"{current["metadata"]["name"]}": the object has been modified; please apply '
                                        "your changes to the latest version and try again")
    meta = result.setdefault("metadata", {})
    for key in SERVER_OWNED + ("resourceVersion",):
        if key in current["metadata"]:
            meta[key] = current["metadata"][key]
        else:
            meta.pop(key, None)
    if "status" in current:
        result["status"] = current["status"]
    result["kind"], result["apiVersion"] = current["kind"], current["apiVersion"]
    _immutable(kind, current, result)
    return result


# -- RFC 6902 -------------------------------------------------------------------------------------------------------

def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"json patch path {path!r} does not start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(document: Any, parts: list[str]) -> tuple[Any, str]:
    target = document
    for part in parts[:-1]:
        target = _step(target, part)
    return target, parts[-1]


def _step(target: Any, part: str) -> Any:
    try:
        return target[int(part)] if isinstance(target, list) else target[part]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, "Invalid", f"doc is missing path: {part}") from None


def json_patch(document: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "a json patch is a list of operations")
    document = copy.deepcopy(document)
    for operation in operations:
        op, parts = operation.get("op"), _pointer(operation.get("path", ""))
        if op in ("move", "copy"):
            value = copy.deepcopy(_get(document, _pointer(operation.get("from", ""))))
            if op == "move":
                document = _remove(document, _pointer(operation["from"]))
            document = _add(document, parts, value)
        elif op == "add":
            document = _add(document, parts, copy.deepcopy(operation.get("value")))
        elif op == "remove":
            document = _remove(document, parts)
        elif op == "replace":
            _get(document, parts)  # must exist
            document = _add(_remove(document, parts), parts, copy.deepcopy(operation.get("value")))
        elif op == "test":
            if _get(document, parts) != operation.get("value"):
                raise ApiError(422, "Invalid", f"testing value {operation.get('path')} failed")
        else:
            raise ApiError(422, "Invalid", f"Unexpected kind: {op}")
    return document


def _get(document: Any, parts: list[str]) -> Any:
    for part in parts:
        document = _step(document, part)
    return document


def _add(document: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    target, last = _parent(document, parts)
    if isinstance(target, list):
        index = len(target) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(target):
            raise ApiError(422, "Invalid", f"add operation does not apply: index {last} out of bounds")
        target.insert(index, value)
    elif isinstance(target, dict):
        target[last] = value
    else:
        raise ApiError(422, "Invalid", f"doc is missing path: {last}")
    return document


def _remove(document: Any, parts: list[str]) -> Any:
    if not parts:
        return None
    target, last = _parent(document, parts)
    _step(target, last)
    if isinstance(target, list):
        del target[int(last)]
    else:
        del target[last]
    return document


# -- RFC 7386 -------------------------------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- strategic merge patch -----------------------------------------------------------------------------------------

@lru_cache(maxsize=4)
def _definitions(version: str) -> dict[str, Any]:
    from pathlib import Path

    import kubernetes_validate

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    found = sorted(root.glob(f"v{version}.*-local"))
    data = json.loads((found[-1] / "_definitions.json").read_text())
    return data.get("$defs") or data.get("definitions") or {}


def _resolve(schema: dict[str, Any] | None, version: str) -> dict[str, Any]:
    while schema:
        ref = schema.get("$ref") or next((part.get("$ref") for part in schema.get("allOf", []) if "$ref" in part),
                                         None)
        if not ref:
            return schema
        schema = {**_definitions(version)[ref.rsplit("/", 1)[1]],
                  **{key: value for key, value in schema.items() if key.startswith("x-kubernetes-patch")}}
    return {}


def _definition(name: str, version: str) -> dict[str, Any]:
    return _definitions(version)[name]


def strategic_merge(target: Any, patch: Any, schema: dict[str, Any], version: str) -> Any:
    schema = _resolve(schema, version)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {key: copy.deepcopy(value) for key, value in patch.items() if key != "$patch"}
    if directive == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    properties = schema.get("properties") or {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [item for item in result.get(field) or [] if item not in value]
            continue
        additional = schema.get("additionalProperties")
        field = _resolve(properties.get(key) or (additional if isinstance(additional, dict) else None), version)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and "merge" in str(field.get("x-kubernetes-patch-strategy", "")).split(","):
            result[key] = _merge_list(result.get(key) or [], value, field, version)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value, field, version)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {key: value for key, value in result.items() if key in retain}
    return result


def _merge_list(current: list[Any], patch: list[Any], field: dict[str, Any], version: str) -> list[Any]:
    key = field.get("x-kubernetes-patch-merge-key")
    if not key:  # a list of scalars: the union, in order
        return list(current) + [item for item in patch if item not in current]
    items = _resolve(field.get("items"), version)
    result = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(422, "Invalid", f"map: {item} does not contain declared merge key: {key}")
        at = next((index for index, old in enumerate(result) if old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del result[at]
        elif at is None:
            result.append({name: value for name, value in item.items() if not name.startswith("$")})
        else:
            result[at] = strategic_merge(result[at], item, items, version)
    return result


# -- what may change --------------------------------------------------------------------------------------------------

def _invalid(kind: str, name: str, field: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {field}: {message}',
                    {"name": name, "kind": kind, "causes": [{"reason": "FieldValueInvalid", "message": message,
                                                              "field": field}]})


def _immutable(kind: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    name = before["metadata"]["name"]
    old, new = before.get("spec") or {}, after.get("spec") or {}
    if kind == "Pod":
        def comparable(spec: dict[str, Any]) -> dict[str, Any]:
            spec = copy.deepcopy(spec)
            for key in ("activeDeadlineSeconds", "terminationGracePeriodSeconds", "tolerations"):
                spec.pop(key, None)
            for container in spec.get("containers") or []:
                container.pop("image", None)
            return spec
        added_only = all(item in (new.get("tolerations") or []) for item in old.get("tolerations") or [])
        if comparable(old) != comparable(new) or not added_only:
            raise _invalid(kind, name, "spec", "Forbidden: pod updates may not change fields other than "
                           "`spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
                           "`spec.tolerations` (only additions to existing tolerations), "
                           "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously "
                           "negative)")
    if kind == "Job":
        for field in ("template", "selector", "completionMode"):
            if old.get(field) != new.get(field):
                raise _invalid(kind, name, f"spec.{field}", "Invalid value: field is immutable")
        if old.get("completions") != new.get("completions") and not (
                new.get("completionMode") == "Indexed" and new.get("completions") == new.get("parallelism")):
            raise _invalid(kind, name, "spec.completions", "Invalid value: field is immutable")
