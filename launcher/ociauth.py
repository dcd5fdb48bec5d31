"""OCI authentication and service endpoints, as OCI users set them up; shared by the client and the nodes.

Auth is chosen like the OCI CLI does: ``OCI_CLI_AUTH`` (``api_key``, ``security_token``,
``resource_principal``, ``instance_principal``), else a resource principal where the service
provides one (``OCI_RESOURCE_PRINCIPAL_VERSION``, inside a job run), else the config file
(``OCI_CLI_CONFIG_FILE`` or ``OCI_CONFIG_FILE``, default ``~/.oci/config``) and profile
(``OCI_CLI_PROFILE``, default ``DEFAULT``); a profile with ``security_token_file`` (made by
``oci session authenticate``) signs with that session token.

Endpoints: ``LAUNCHER_OCI_ENDPOINT`` (one base URL for every service, as a simulation serves
them), else the spec's ``endpoints``, else the SDK's own for the region.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from launcher.errors import BackendError

AUTH_METHODS = ("api_key", "security_token", "resource_principal", "instance_principal")
SERVICES = ("dataScience", "objectStorage", "logging", "virtualNetwork")  # virtualNetwork: nodes read their subnet
# Set by the client in the nodes' env when Object Storage is not at the SDK's default endpoint.
NODE_OBJECT_STORAGE_ENDPOINT = "LAUNCHER_OCI_OBJECT_STORAGE_ENDPOINT"


def auth_method(env: Mapping[str, str] = os.environ) -> str:
    method = env.get("OCI_CLI_AUTH") or ("resource_principal" if env.get("OCI_RESOURCE_PRINCIPAL_VERSION")
                                         else "api_key")
    if method not in AUTH_METHODS:
        raise BackendError(f"OCI_CLI_AUTH={method!r}: use one of {', '.join(AUTH_METHODS)}")
    return method


def config_location(env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    path = env.get("OCI_CLI_CONFIG_FILE") or env.get("OCI_CONFIG_FILE") or "~/.oci/config"
    return str(Path(path).expanduser()), env.get("OCI_CLI_PROFILE") or "DEFAULT"


def sdk_auth(env: Mapping[str, str] = os.environ) -> tuple[dict[str, Any], Any]:
    """(config, signer) for SDK clients; signer None means the SDK signs with the config's API key."""
    import oci

    method = auth_method(env)
    try:
        if method == "resource_principal":
            signer = oci.auth.signers.get_resource_principals_signer()
            return {"region": signer.region}, signer
        if method == "instance_principal":
            signer = oci.auth.signers.InstancePrincipalsSecurityTokenSigner()
            return {"region": signer.region}, signer
        path, profile = config_location(env)
        config = oci.config.from_file(path, profile)
        if method == "security_token" or config.get("security_token_file"):
            token = Path(config["security_token_file"]).expanduser().read_text().strip()
            key = oci.signer.load_private_key_from_file(config["key_file"], config.get("pass_phrase"))
            return config, oci.auth.signers.SecurityTokenSigner(token, key)
        oci.config.validate_config(config)
        return config, None
    except (oci.exceptions.ClientError, OSError, KeyError, ValueError) as exc:
        raise BackendError(f"OCI credentials ({method}): {exc}") from None


def endpoint(service: str, spec_endpoints: Mapping[str, str] | None = None,
             env: Mapping[str, str] = os.environ) -> str | None:
    """Base URL for ``service`` (one of SERVICES), or None for the SDK's default."""
    return env.get("LAUNCHER_OCI_ENDPOINT") or (spec_endpoints or {}).get(service) or None


def ocifs_options(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Keyword arguments for ``ocifs.OCIFileSystem``: the same auth and endpoint as the SDK clients."""
    options: dict[str, Any] = {}
    method = auth_method(env)
    if method in ("resource_principal", "instance_principal"):
        options["iam_type"] = method
    else:
        config, signer = sdk_auth(env)
        options["config"] = config
        if signer is not None:
            options["signer"] = signer
    url = env.get(NODE_OBJECT_STORAGE_ENDPOINT) or endpoint("objectStorage", env=env)
    if url:
        options["config_kwargs"] = {"service_endpoint": url}
    return options
