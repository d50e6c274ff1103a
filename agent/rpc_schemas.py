"""JSON schemas of the RPC payloads. A payload that fails its schema is
refused before anything is read or changed."""
from __future__ import annotations

from jsonschema import Draft202012Validator

from agent.exception import InvalidRequest

UUID = {"type": "string",
        "pattern": "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   "[0-9a-fA-F]{12}$"}
SPEC = {
    "type": "object",
    "required": ["name", "vcpus", "memory_mb"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 255},
        "vcpus": {"type": "integer", "minimum": 1, "maximum": 4096},
        "memory_mb": {"type": "integer", "minimum": 1, "maximum": 1 << 24},
    },
    "additionalProperties": False,
}
ALLOCATIONS = {
    "type": "object",
    "minProperties": 1,
    "maxProperties": 64,
    "propertyNames": UUID,
    "additionalProperties": {
        "type": "object",
        "required": ["resources"],
        "properties": {"resources": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 32,
            "propertyNames": {"pattern": "^[A-Z][A-Z0-9_]{0,254}$"},
            "additionalProperties": {"type": "integer", "minimum": 1,
                                     "maximum": 1 << 20},
        }},
    },
}


def _schema(**properties) -> dict:
    return {"type": "object", "required": sorted(properties),
            "properties": properties, "additionalProperties": False}


INSTANCE = _schema(instance_uuid=UUID)
CLAIM = _schema(instance_uuid=UUID, spec=SPEC, allocations=ALLOCATIONS)
MOVE = _schema(migration_uuid=UUID, instance_uuid=UUID)
MOVE_CLAIM = _schema(migration_uuid=UUID, instance_uuid=UUID, spec=SPEC,
                     allocations=ALLOCATIONS)
NOTHING = _schema()


def validate(schema: dict, payload: dict) -> None:
    """Raise InvalidRequest naming the first bad field and its value."""
    error = next(iter(sorted(Draft202012Validator(schema).iter_errors(payload),
                             key=lambda e: list(e.absolute_path))), None)
    if error is None:
        return
    path = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required":
        missing = next(f for f in error.validator_value if f not in error.instance)
        raise InvalidRequest(".".join(filter(None, [path, missing])), None, "missing")
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        raise InvalidRequest(".".join(filter(None, [path, extra[0]])),
                             error.instance[extra[0]], "unknown field")
    if error.validator == "propertyNames":
        raise InvalidRequest(path or "payload", error.instance,
                             "has a key that is not allowed here")
    raise InvalidRequest(path or "payload", error.instance, error.message[:120])
