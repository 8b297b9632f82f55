"""protobuf <-> the pydantic models of grpo.reward.schemas, for the gRPC edge and the client."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from pydantic import BaseModel, ValidationError

from grpo.reward.errors import InputError

M = TypeVar("M", bound=BaseModel)
P = TypeVar("P", bound=Message)


def _tests_from_proto(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # CodeTest is a oneof {stdio, assert}; the JSON contract has the two shapes side by side.
    return [t["stdio"] if set(t) == {"stdio"} else t for t in tests]


def _tests_to_proto(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"assert": t["assert"]} if "assert" in t else {"stdio": t} for t in tests]


def _drop_empty(data: dict[str, Any], key: str) -> None:
    # proto3 strings without presence arrive as "" when unset: let the model's default apply.
    if data.get(key) == "":
        del data[key]


def _adapt_checks_in(checks: dict[str, Any]) -> dict[str, Any]:
    if "math" in checks and not checks["math"].get("extraction"):
        checks["math"].pop("extraction", None)  # an empty repeated field is "unset": the default parsers
    if "code" in checks:
        checks["code"]["tests"] = _tests_from_proto(checks["code"].get("tests", []))
        _drop_empty(checks["code"], "language")
        _drop_empty(checks["code"], "compare")
        if "checker" in checks["code"]:
            _drop_empty(checks["code"]["checker"], "language")
    if "language" in checks:
        _drop_empty(checks["language"], "target")
    if "steps" in checks and checks["steps"].get("spans") == []:
        del checks["steps"]["spans"]  # an empty repeated field is "unset": the delimiter or the rule's own cut
    for name, plugin in checks.get("plugins", {}).items():
        raw = plugin.pop("kwargs_json", "") or "{}"
        try:
            plugin["kwargs"] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(f"checks.plugins[{name!r}].kwargs_json is not valid JSON: {exc}") from None
    return checks


def proto_to_dict(msg: Message) -> dict[str, Any]:
    """The JSON-contract dict of a request message (oneofs and plug-in kwargs adapted)."""
    data = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    if "tests" in data:
        data["tests"] = _tests_from_proto(data["tests"])
    _drop_empty(data, "language")
    _drop_empty(data, "compare")
    if "checker" in data:
        _drop_empty(data["checker"], "language")
    if data.get("extraction") == []:
        del data["extraction"]
    for item in data.get("items", []):
        if "checks" in item:
            _adapt_checks_in(item["checks"])
    return data


def validation_message(exc: ValidationError) -> str:
    """One line per problem, `field.path: message`, for INVALID_ARGUMENT and client errors."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "request"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


class Undecodable:
    """What the gRPC edge's deserializer hands on for bytes that are not the request message."""

    def __init__(self, message_type: str, reason: str) -> None:
        self.message_type, self.reason = message_type, reason


def parse_request(model: type[M], msg: Message | Undecodable) -> M:
    """Validate a request message as `model`; raises InputError with the fields named."""
    if isinstance(msg, Undecodable):
        raise InputError(f"the request is not a valid {msg.message_type}: {msg.reason}")
    try:
        return model.model_validate(proto_to_dict(msg))
    except ValidationError as exc:
        raise InputError(validation_message(exc)) from None


def model_to_proto(model: BaseModel, proto: P) -> P:
    """Fill `proto` from a pydantic model (fields the proto lacks are dropped, None means unset)."""
    data = model.model_dump(by_alias=True, exclude_none=True)
    if "tests" in data and isinstance(data["tests"], list) and data["tests"] and "verdict" not in data["tests"][0]:
        data["tests"] = _tests_to_proto(data["tests"])
    for item in data.get("items", []):
        checks = item.get("checks", {})
        if "code" in checks:
            checks["code"]["tests"] = _tests_to_proto(checks["code"]["tests"])
        for plugin in checks.get("plugins", {}).values():
            plugin["kwargs_json"] = json.dumps(plugin.pop("kwargs", {}))
    return json_format.ParseDict(data, proto, ignore_unknown_fields=True)


def proto_to_model(model: type[M], msg: Message) -> M:
    """A response message as its pydantic model (the client side)."""
    data = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return model.model_validate(data)
