"""nodus plugin providing json-schema@1."""

from nodus.core import hookimpl

from nodus_env_json_schema.environment import JsonSchema

__all__ = ["JsonSchema", "nodus_register_environments"]


@hookimpl
def nodus_register_environments(register):  # type: ignore[no-untyped-def]
    register(JsonSchema)
