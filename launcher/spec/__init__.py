"""The spec: loading YAML with positions, validating it against the JSON schema, typed objects."""

from launcher.spec.load import load_spec

__all__ = ["load_spec"]
