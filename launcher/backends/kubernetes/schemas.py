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
