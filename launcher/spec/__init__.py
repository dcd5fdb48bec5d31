"""The spec: loading YAML with positions, validating it against the JSON schema, typed objects."""

from launcher.spec.load import load_spec
from launcher.spec.overrides import Overrides

__all__ = ["Overrides", "load_spec"]
