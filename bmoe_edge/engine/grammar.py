"""Grammars for constrained sampling (llama.cpp's GBNF, applied by `llama_sampler_init_grammar` in the
engine's sampler chain): any JSON object, and a JSON schema turned into a grammar.

The schema converter covers the subset of JSON Schema that structured-output clients send (OpenAI's
`strict` subset and a little more); a schema using anything else is refused with the keyword named,
never approximated: output that parses but breaks the schema would be worse than a clear 400. The
approach follows llama.cpp's json-schema-to-grammar (one rule per sub-schema, properties in their
declared order); the code and the JSON grammar are our own."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from bmoe_edge.errors import BmoeError

# JSON text (RFC 8259) with bounded whitespace: a model cannot spend its tokens on blank space.
# Numbers: at most 16 digits before and after the point and 3 in the exponent.
JSON_RULES = {
    "ws": '( " " | "\\n" [ \\t]{0,16} )?',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}"',
    "array": '"[" ws ( value ( "," ws value )* )? "]"',
    "char": '[^"\\\\\\x00-\\x1F\\x7F] | "\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{4} )',
    "string": '"\\"" char* "\\"" ws',
    "integer": '"-"? ( "0" | [1-9] [0-9]{0,15} ) ws',
    "number": '"-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )? ws',
    "boolean": '( "true" | "false" ) ws',
    "null": '"null" ws',
}
# Each rule ends with its own optional whitespace, so separators need none before them.
JSON_RULES["object"] += " ws"
JSON_RULES["array"] += " ws"


def _grammar(root: str, rules: Mapping[str, str]) -> str:
    return "\n".join([f"root ::= {root}", *(f"{name} ::= {body}" for name, body in rules.items())]) + "\n"


def json_object() -> str:
    """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
    return _grammar("object", JSON_RULES)


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{out}"'


# Keywords that only describe; they constrain nothing.
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly", "strict", "name"}
HANDLED = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum",
           "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength"}
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
MAX_REPEAT = 1000


class UnsupportedSchema(BmoeError):
    pass


class _Converter:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}
        self.open: list[str] = []  # the definitions being converted since the last "{" or "[" was written

    def rule(self, hint: str, body: str) -> str:
        name = re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-").lower() or "r"
        name = f"s-{name}"
        unique, n = name, 1
        while unique in self.rules and self.rules[unique] != body:
            n += 1
            unique = f"{name}{n}"
        self.rules[unique] = body
        return unique

    def visit(self, schema: Any, hint: str) -> str:
        """A GBNF expression for the schema (usually a rule name)."""
        if schema is True or schema == {}:
            return "value"
        if not isinstance(schema, Mapping):
            raise UnsupportedSchema(f"the schema at {hint!r} must be an object")
        unknown = set(schema) - HANDLED - ANNOTATIONS
        if unknown:
            raise UnsupportedSchema(f"the JSON schema keyword(s) {', '.join(sorted(unknown))} (at {hint!r}) are not "
                                    "supported by this server's grammar; supported: "
                                    + ", ".join(sorted(HANDLED - {'$defs', 'definitions'})))
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "const" in schema:
            return self.rule(hint, f"{literal(json.dumps(schema['const']))} ws")
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise UnsupportedSchema(f"'enum' at {hint!r} must be a non-empty list")
            return self.rule(hint, "( " + " | ".join(literal(json.dumps(v)) for v in values) + " ) ws")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise UnsupportedSchema(f"'{key}' at {hint!r} must be a non-empty list")
                return self.rule(hint, " | ".join(self.visit(o, f"{hint}-{i}") for i, o in enumerate(options)))
        kind = schema.get("type")
        if isinstance(kind, list) and not kind:
            raise UnsupportedSchema(f"'type' at {hint!r} must name at least one type")
        if isinstance(kind, list):
            return self.rule(hint, " | ".join(self.typed(schema, k, f"{hint}-{k}") for k in kind))
        if kind is None:
            if "properties" in schema:
                kind = "object"
            elif "items" in schema:
                kind = "array"
            else:
                return "value"
        return self.typed(schema, kind, hint)

    def typed(self, schema: Mapping[str, Any], kind: Any, hint: str) -> str:
        if kind not in TYPES:
            raise UnsupportedSchema(f"unknown JSON schema type {kind!r} at {hint!r}")
        if kind == "object":
            return self.object(schema, hint)
        if kind == "array":
            return self.array(schema, hint)
        if kind == "string" and ("minLength" in schema or "maxLength" in schema):
            lo, hi = self.bounds(schema, "minLength", "maxLength", hint)
            return self.rule(hint, f'"\\"" char{{{lo},{hi}}} "\\"" ws')
        return kind

    def bounds(self, schema: Mapping[str, Any], lo_key: str, hi_key: str, hint: str) -> tuple[int, str]:
        lo, hi = schema.get(lo_key, 0), schema.get(hi_key)
        if not isinstance(lo, int) or (hi is not None and not isinstance(hi, int)) or lo < 0 \
                or (hi is not None and hi < lo) or max(lo, hi or 0) > MAX_REPEAT:
            raise UnsupportedSchema(f"'{lo_key}'/'{hi_key}' at {hint!r} must be integers from 0 to {MAX_REPEAT}")
        return lo, "" if hi is None else str(hi)

    def object(self, schema: Mapping[str, Any], hint: str) -> str:
        with self.guarded():
            return self._object(schema, hint)

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """Inside an object or an array a definition may refer to itself: a "{" or "[" comes first."""
        saved, self.open = self.open, []
        try:
            yield
        finally:
            self.open = saved

    def _object(self, schema: Mapping[str, Any], hint: str) -> str:
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None:
            if extra not in (None, True, {}):
                raise UnsupportedSchema(f"'additionalProperties' as a schema (at {hint!r}) is not supported")
            return "object"
        if not isinstance(props, Mapping):
            raise UnsupportedSchema(f"'properties' at {hint!r} must be an object")
        if extra not in (None, False):
            raise UnsupportedSchema(f"objects with 'properties' and additional properties (at {hint!r}) are not "
                                    "supported: set \"additionalProperties\": false")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required) \
                or not set(required) <= set(props):
            raise UnsupportedSchema(f"'required' at {hint!r} must list names of its 'properties'")
        pairs = [(name, f'{literal(json.dumps(name))} ws ":" ws {self.visit(sub, f"{hint}-{name}")}')
                 for name, sub in props.items()]
        # Properties in their declared order; the optional ones may be left out.
        body = self._members(pairs, set(required), hint)
        return self.rule(hint, f'"{{" ws {body} "}}" ws')

    def _members(self, pairs: list[tuple[str, str]], required: set[str], hint: str) -> str:
        """The members in order, the optional ones maybe left out, commas only between two members:
        `rest(i, first)` is everything from member i on (`first`: no member written before it)."""
        memo: dict[tuple[int, bool], str] = {}

        def rest(i: int, first: bool) -> str:
            if i == len(pairs):
                return ""
            if (i, first) not in memo:
                name, pair = pairs[i]
                sep = "" if first else '"," ws '
                taken = f"{sep}{pair} {rest(i + 1, False)}".strip()
                if name in required:
                    memo[i, first] = taken
                else:   # a rule per optional member keeps the grammar linear in the number of members
                    skipped = rest(i + 1, first)
                    memo[i, first] = self.rule(f"{hint}-{i}{'-first' if first else ''}",
                                               f"{taken} | {skipped}" if skipped else f"( {taken} )?")
            return memo[i, first]

        return f"( {rest(0, True)} )"

    def array(self, schema: Mapping[str, Any], hint: str) -> str:
        with self.guarded():
            return self._array(schema, hint)

    def _array(self, schema: Mapping[str, Any], hint: str) -> str:
        item = self.visit(schema.get("items", True), f"{hint}-item")
        lo, hi = self.bounds(schema, "minItems", "maxItems", hint)
        if hi == "0":
            return self.rule(hint, '"[" ws "]" ws')
        first_lo, rest_hi = max(lo - 1, 0), "" if hi == "" else str(int(hi) - 1)
        items = f'{item} ( "," ws {item} ){{{first_lo},{rest_hi}}}'
        body = f"( {items} )" if lo > 0 else f"( {items} )?"
        return self.rule(hint, f'"[" ws {body} "]" ws')

    def ref(self, ref: Any) -> str:
        if not isinstance(ref, str) or not re.fullmatch(r"#/(\$defs|definitions)/[^/]+", ref):
            raise UnsupportedSchema(f"'$ref' {ref!r}: only local references (#/$defs/NAME, #/definitions/NAME)")
        if ref not in self.refs:
            section, name = ref[2:].split("/", 1)
            defs = self.root.get(section) if isinstance(self.root, Mapping) else None
            if defs is not None and not isinstance(defs, Mapping):
                raise UnsupportedSchema(f"'{section}' must be an object of named schemas")
            target = (defs or {}).get(name)
            if target is None:
                raise UnsupportedSchema(f"'$ref' {ref!r} names no definition")
            rule = f"s-ref-{re.sub(r'[^a-zA-Z0-9-]+', '-', name).lower()}"
            self.refs[ref] = rule
            self.rules[rule] = "( )"  # placeholder: a definition may refer to itself
            self.open.append(ref)
            self.rules[rule] = self.visit(target, f"def-{name}")
            self.open.remove(ref)
        elif ref in self.open:   # a grammar cannot start a rule with itself (llama.cpp refuses left recursion)
            raise UnsupportedSchema(f"'$ref' {ref!r} refers to itself before any JSON is written (a definition "
                                    "may refer to itself only inside an object or an array)")
        return self.refs[ref]


def from_schema(schema: Any) -> str:
    """GBNF for JSON that follows `schema` (the subset named in HANDLED); UnsupportedSchema otherwise."""
    if not isinstance(schema, Mapping):
        raise UnsupportedSchema("the JSON schema must be an object")
    conv = _Converter(schema)
    with converting():
        root = conv.visit(schema, "root")
    return _grammar(root, {**conv.rules, **JSON_RULES})


@contextlib.contextmanager
def converting() -> Iterator[None]:
    """A schema the converter's checks did not foresee (a wrong type somewhere, nesting past Python's
    recursion limit) is refused like any unsupported one, never a crash."""
    try:
        yield
    except UnsupportedSchema:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
        raise UnsupportedSchema(f"the JSON schema cannot be used: {type(exc).__name__}: {exc}") from None
