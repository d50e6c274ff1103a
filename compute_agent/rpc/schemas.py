"""What an RPC payload must be (pure rules), checked whole before anything is read or
changed: its shape (how deep, how wide), its JSON schema, and the rules a
schema cannot say. Every refusal is one InvalidRequest naming the field.
"""
from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

from compute_agent.claims.choice import InstanceSpec, check_spec_carried
from compute_agent.exception import InvalidRequest

# `\Z`, not `$`: `$` also matches before a final newline. Either case is a
# UUID; canonical() makes it lower case, as Placement and the store have it.
UUID = {"type": "string",
        "pattern": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   r"[0-9a-fA-F]{12}\Z"}
UUID_FIELDS = ("instance_uuid", "migration_uuid")
# A PCI address, "dddd:bb:ss.f" (compute_agent/common/pci_address.py), either case.
PCI_ADDRESS = {"type": "string",
               "pattern": r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[01][0-9a-fA-F]\.[0-7]\Z"}

MAX_PROVIDERS = 64
MAX_RESOURCE_CLASSES = 32
# The deepest payload any call takes: live_migrate's destination, its
# claimed devices, one of them, its device and the device's detail. And
# the widest object in one.
MAX_DEPTH = 6
MAX_ENTRIES = max(MAX_PROVIDERS, MAX_RESOURCE_CLASSES)

# Its limits are read by compute-agent-ctl's help too: typed as the JSON it is.
SPEC: dict[str, Any] = {
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
    "maxProperties": MAX_PROVIDERS,
    "propertyNames": UUID,
    "additionalProperties": {
        "type": "object",
        "required": ["resources"],
        "properties": {"resources": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": MAX_RESOURCE_CLASSES,
            "propertyNames": {"pattern": r"^[A-Z][A-Z0-9_]{0,254}\Z"},
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
DEVICE = _schema(address=PCI_ADDRESS)
# The destination's answer to check_can_live_migrate_destination, as the
# source takes it; each claimed device is read strictly by
# compute_agent.drivers.migration.ClaimedDevice.
DESTINATION = {
    "type": "object",
    "required": ["claimed", "migration_uri"],
    "properties": {
        "claimed": {"type": "array", "maxItems": MAX_PROVIDERS,
                    "items": {"type": "object"}},
        "migration_uri": {"type": "string", "minLength": 1, "maxLength": 1024},
    },
    "additionalProperties": False,
}
LIVE_MIGRATE = {**MOVE, "properties": {**MOVE["properties"],
                                       "destination": DESTINATION}}
HOST = {"type": "string", "minLength": 1, "maxLength": 255}
# 1.4: the live migration's source is told of the move, and where to, before
# the conductor swaps the allocations.
SOURCE_CHECK = _schema(migration_uuid=UUID, instance_uuid=UUID, destination_host=HOST)
# 1.3: an evacuation names its source, which the caller asserts is down.
REBUILD = {**MOVE_CLAIM,
           "properties": {**MOVE_CLAIM["properties"], "source_host": HOST,
                          "force": {"type": "boolean"}}}


def validator(schema: dict) -> Draft202012Validator:
    """The validator of one payload schema, made once per call."""
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _dotted(path) -> str:
    return ".".join(str(p) for p in path)


def check_shape(payload: dict) -> None:
    """Refuse an object or list nested deeper, or wider, than any call
    takes, before a schema walks it: a schema reports every error it finds
    (200,000 of them for a map that size) and recurses once per level."""
    todo: list[tuple[tuple, object]] = [((), payload)]
    while todo:
        path, value = todo.pop()
        if not isinstance(value, (dict, list)):
            continue
        shown = "an object" if isinstance(value, dict) else "a list"
        if len(path) >= MAX_DEPTH:
            raise InvalidRequest(_dotted(path), None,
                                 f"nested deeper than {MAX_DEPTH} levels", shown)
        if len(value) > MAX_ENTRIES:
            raise InvalidRequest(_dotted(path) or "payload", None,
                                 f"has {len(value)} entries, at most {MAX_ENTRIES}",
                                 shown)
        entries = value.items() if isinstance(value, dict) else enumerate(value)
        todo.extend((path + (key,), inner) for key, inner in entries)


def validate(checker: Draft202012Validator, payload: dict) -> None:
    """Raise InvalidRequest naming the first bad field and its value; the
    errors are found lazily, and only the first is looked for."""
    error = next(checker.iter_errors(payload), None)
    if error is None:
        return
    path = _dotted(error.absolute_path)
    if error.validator == "required":
        missing = next(f for f in error.validator_value if f not in error.instance)
        raise InvalidRequest(".".join(filter(None, [path, missing])), None, "missing")
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        raise InvalidRequest(".".join(filter(None, [path, extra[0]])),
                             error.instance[extra[0]], "unknown field")
    # jsonschema reports a key that propertyNames refuses as the error of
    # the schema it failed (its pattern), one step under propertyNames.
    if list(error.schema_path)[-2:-1] == ["propertyNames"]:
        raise InvalidRequest(path or "payload", error.instance,
                             "has a key that is not allowed here")
    if error.validator in ("maxProperties", "minProperties"):
        bound = "at most" if error.validator == "maxProperties" else "at least"
        raise InvalidRequest(path or "payload", None,
                             f"has {len(error.instance)} entries, {bound} "
                             f"{error.validator_value}", "an object")
    raise InvalidRequest(path or "payload", error.instance, error.message[:120])


def canonical_allocations(allocations: dict) -> dict:
    """The allocations keyed by lower-case provider uuids; a provider named
    twice (in two cases) is refused."""
    out: dict = {}
    for provider, body in allocations.items():
        key = provider.lower()
        if key in out:
            raise InvalidRequest(f"allocations.{provider}", provider,
                                 "names a provider already named")
        out[key] = body
    return out


def check_move_uuids(payload: dict) -> None:
    """A move is not its instance: the two uuids differ."""
    if "migration_uuid" in payload and payload["migration_uuid"] == payload.get(
            "instance_uuid"):
        raise InvalidRequest("migration_uuid", payload["migration_uuid"],
                             "is the instance's own uuid")


def canonical(payload: dict) -> dict:
    """The payload as the manager takes it: uuids and a PCI address in
    lower case, the spec
    checked as the claim will read it and against the vCPUs and memory its
    allocations carry (which name only this host's providers, or the claim
    refuses them), the move's two uuids told apart."""
    out = dict(payload)
    for name in UUID_FIELDS + ("address",):
        if name in out:
            out[name] = out[name].lower()
    if "allocations" in out:
        out["allocations"] = canonical_allocations(out["allocations"])
    if "spec" in out:
        spec = InstanceSpec.from_payload(out["spec"])
        check_spec_carried(spec, [body["resources"]
                                  for body in out["allocations"].values()])
    check_move_uuids(out)
    return out


def checked(checker: Draft202012Validator, payload: dict) -> dict:
    """``payload`` checked whole (shape, schema, the rules past a schema),
    in the canonical form the manager takes."""
    check_shape(payload)
    validate(checker, payload)
    return canonical(payload)
