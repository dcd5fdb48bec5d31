"""Every object checked against the official OpenAPI schema of a Kubernetes version before it is shown or sent
(``kubernetes-validate`` ships the schemas of each release), strictly: a field the API does not know is an
error, as the API server's strict field validation makes it."""

from __future__ import annotations

from typing import Any, Iterable

from launcher.errors import BadInput

OLDEST = "1.31"  # the oldest version supported: podFailurePolicy is GA there, backoffLimitPerIndex beta (on)


def check(objects: Iterable[dict[str, Any]], version: str = OLDEST) -> None:
    """Raise BadInput naming the object, the field and the schema's words for the first object that does not
    validate against Kubernetes ``version``."""
    try:
        import kubernetes_validate
    except ImportError:
        raise BadInput("the kubernetes backend checks every object against the official schemas: "
                       "pip install 'launcher[kubernetes]' (kubernetes-validate)") from None
    for body in objects:
        try:
            kubernetes_validate.validate(body, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(part) for part in exc.absolute_path) or "(the object)"
            raise BadInput(f"{body.get('kind')} {body.get('metadata', {}).get('name')}: {where}: {exc.message} "
                           f"(the official schema of Kubernetes {version})") from None
        except kubernetes_validate.utils.VersionNotSupportedError:
            raise BadInput(f"kubernetes-validate has no schema for Kubernetes {version}; upgrade it") from None


def newest() -> str:
    """The newest version whose schema is installed (``1.37``)."""
    import kubernetes_validate

    return ".".join(kubernetes_validate.latest_version().split(".")[:2])


def _shipped() -> list[str]:
    """The versions whose schemas kubernetes-validate ships, oldest first (``1.25`` ... ``1.37``)."""
    import kubernetes_validate.utils

    return sorted({".".join(v.split(".")[:2]) for v in kubernetes_validate.utils.all_versions()}, key=_key)


def _key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def check_for_cluster(objects: list[dict[str, Any]], version: str) -> str:
    """Check the objects against the schema of the cluster's version (the newest installed for a cluster newer than
    that); refuse a cluster older than a field the run needs, naming the version that has it, and one older than
    :data:`OLDEST`. Returns the schema's version."""
    shipped = _shipped()
    schema = version if version in shipped else shipped[-1] if _key(version) > _key(shipped[-1]) else shipped[0]
    try:
        check(objects, schema)
    except BadInput as exc:
        has = next((v for v in shipped if _key(v) > _key(schema) and _passes(objects, v)), None)
        raise BadInput(f"the cluster runs Kubernetes {version}, whose API refuses what the run needs: {exc}"
                       + (f"; Kubernetes {has} takes it" if has else "")
                       + f" (the kubernetes backend needs Kubernetes {OLDEST} or later)") from None
    if _key(version) < _key(OLDEST):
        raise BadInput(f"the cluster runs Kubernetes {version}; the kubernetes backend needs {OLDEST} or later "
                       "(podFailurePolicy is GA there, backoffLimitPerIndex beta and on)")
    return schema


def _passes(objects: list[dict[str, Any]], version: str) -> bool:
    try:
        check(objects, version)
    except BadInput:
        return False
    return True
