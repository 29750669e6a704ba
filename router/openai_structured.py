"""OpenAI's structured-output fields as a ``StructuredOutput``, and tool calls read back out of the output.

- ``response_format``: ``{"type": "json_object"}``, or ``{"type": "json_schema", "json_schema":
  {"name", "schema", "strict"}}`` (strict or not, the output follows the schema: the grammar
  allows nothing else).
- ``structured_outputs`` (vLLM's extension field): ``{"json": schema}``, ``{"regex": pattern}`` or
  ``{"grammar": lark}``.
- Chat's ``tools`` with ``tool_choice`` ``"required"`` or a named function: the output is one call,
  ``{"name": ..., "arguments": {...}}``, constrained to the tools' parameter schemas, and answered as
  ``message.tool_calls`` with finish reason ``tool_calls``. ``"auto"`` (the model choosing between
  text and a call) is refused: which text marks a call is the model's own convention, and a grammar
  that allowed either could not tell a call from prose that looks like one. ``"none"``: the tools
  are ignored.

The schemas themselves are checked where every request's grammar is, in ``router/validation.py``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from specserve.proto.v1 import specserve_pb2 as pb


class FieldError(ValueError):
    """A field the client must fix: the message, and the field (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolMode:
    """A request answered with a tool call: the tools it may call (their OpenAI definitions)."""

    tools: tuple[dict, ...]

    def call(self, text: str) -> dict | None:
        """The output as OpenAI's ``tool_calls`` entry; None where it is not a whole call (cut by max_tokens)."""
        try:
            call = json.loads(text)
        except ValueError:
            return None
        if not isinstance(call, dict) or "name" not in call:
            return None
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}}


def structured_output(fields: dict, chat: bool) -> tuple[pb.StructuredOutput | None, ToolMode | None]:
    """The request's grammar from its OpenAI fields (at most one of them), and its tools if it is
    answered with a call."""
    tools = _tool_mode(fields) if chat else None
    asked = [name for name in ("response_format", "structured_outputs") if fields.get(name) is not None]
    formats = [_response_format(fields["response_format"])] if "response_format" in asked else []
    if "structured_outputs" in asked:
        formats.append(_structured_outputs(fields["structured_outputs"]))
    formats = [f for f in formats if f is not None]
    if tools is not None:
        formats.append(pb.StructuredOutput(json_schema=json.dumps(_call_schema(tools.tools))))
    if len(formats) > 1:
        raise FieldError("ask for one output format: response_format, structured_outputs or a tool call, not several",
                         asked[-1] if asked else "tools")
    return (formats[0] if formats else None), tools


def _response_format(value) -> pb.StructuredOutput | None:
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise FieldError("response_format must be {type: text}, {type: json_object} or "
                         "{type: json_schema, json_schema: {name, schema}}", "response_format")
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return pb.StructuredOutput(json_object=True)
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise FieldError("response_format json_schema needs json_schema.schema, the JSON schema as an object",
                         "response_format")
    return pb.StructuredOutput(json_schema=json.dumps(spec["schema"]))


def _structured_outputs(value) -> pb.StructuredOutput:
    kinds = {"json": "json_schema", "regex": "regex", "grammar": "lark"}
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in kinds:
        raise FieldError("structured_outputs takes one of json (a schema), regex or grammar (Lark)",
                         "structured_outputs")
    (name, source), = value.items()
    if name == "json":
        source = source if isinstance(source, str) else json.dumps(source)
    elif not isinstance(source, str):
        raise FieldError(f"structured_outputs.{name} must be a string", "structured_outputs")
    return pb.StructuredOutput(**{kinds[name]: source})


def _tool_mode(fields: dict) -> ToolMode | None:
    tools, choice = fields.get("tools"), fields.get("tool_choice")
    if not tools or choice == "none":
        if choice not in (None, "none"):
            raise FieldError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list) or not all(_is_function(tool) for tool in tools):
        raise FieldError("tools must be a list of {type: function, function: {name, parameters}}", "tools")
    names = [tool["function"]["name"] for tool in tools]
    if choice in (None, "auto"):
        raise FieldError("tool_choice auto is not served (the model cannot be made to choose between text and a "
                         "call losslessly): set tool_choice to required, to a named function, or to none",
                         "tool_choice")
    if choice == "required":
        return ToolMode(tuple(tools))
    function = choice.get("function") if isinstance(choice, dict) else None
    named = function.get("name") if isinstance(function, dict) else None
    if named not in names:
        raise FieldError(f"tool_choice must be none, required or {{type: function, function: {{name}}}} naming one "
                         f"of the tools ({', '.join(names)}), got {choice!r}", "tool_choice")
    return ToolMode(tuple(tool for tool in tools if tool["function"]["name"] == named))


def _is_function(tool) -> bool:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    return (isinstance(function, dict) and isinstance(function.get("name"), str)
            and isinstance(function.get("parameters", {}), dict))


def _call_schema(tools: tuple[dict, ...]) -> dict:
    """One call of one of ``tools``: its name, and arguments that follow its parameters' schema.

    A parameters schema's definitions (``$defs``, ``definitions``: pydantic writes them) move to
    the root, renamed per tool, and its references with them: a reference is a pointer from the
    root of the whole schema, where the parameters are now nested."""
    calls, definitions = [], {}
    for number, tool in enumerate(tools):
        parameters = dict(tool["function"].get("parameters") or {"type": "object"})
        found = {(key, name): schema for key in ("$defs", "definitions")
                 for name, schema in (parameters.pop(key, None) or {}).items()}
        moved = {f"#/{key}/{name}": f"tool{number}_{name}" for key, name in found}
        for (key, name), schema in found.items():
            definitions[moved[f"#/{key}/{name}"]] = _moved_refs(schema, moved)
        calls.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                      "properties": {"name": {"const": tool["function"]["name"]},
                                     "arguments": _moved_refs(parameters, moved)}})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return schema | {"$defs": definitions} if definitions else schema


def _moved_refs(schema, moved: dict[str, str]):
    """``schema`` with each ``$ref`` to a moved definition pointing at its new place."""
    if isinstance(schema, dict):
        return {key: (f"#/$defs/{moved[value]}" if key == "$ref" and value in moved else _moved_refs(value, moved))
                for key, value in schema.items()}
    if isinstance(schema, list):
        return [_moved_refs(item, moved) for item in schema]
    return schema
