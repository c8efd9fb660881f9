"""A request's JSON schemas (response_format, each tool's parameters) checked against limits.py before
llama.cpp common turns them into a grammar: a walk of the schema, linear in its size, on the event loop. What
it stops: a repetition past llama.cpp's grammar threshold (refused by the grammar parser only later, on the
engine thread), an object with so many optional properties that the converter runs for minutes (it is cubic
in them), an enum or a schema big enough to make a grammar that costs more to build than to answer."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from bmoe_edge.errors import RequestError
from bmoe_edge.serve import limits

# Keywords whose number becomes a repetition count in the grammar ({n,m})
COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minContains",
          "maxContains")
# A pattern's quantifier {n}, {n,} or {n,m}: common's regex -> grammar keeps the counts
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class Budget:
    """What all of one request's schemas may take together."""

    def __init__(self) -> None:
        self.nodes = limits.MAX_SCHEMA_NODES


def check_schema(schema: Any, where: str, budget: Budget | None = None) -> None:
    """Refuse (RequestError naming `where` and the limit) a schema past any of limits.py's bounds."""
    budget = budget or Budget()
    size = len(json.dumps(schema, ensure_ascii=False))
    if size > limits.MAX_SCHEMA_BYTES:
        raise RequestError(f"{where}: the schema is {size} bytes; at most {limits.MAX_SCHEMA_BYTES} are taken")
    todo: list[Any] = [schema]
    while todo:
        value = todo.pop()
        budget.nodes -= 1
        if budget.nodes < 0:
            raise RequestError(f"{where}: the request's schemas have more than {limits.MAX_SCHEMA_NODES} parts")
        if isinstance(value, Mapping):
            _check_keywords(value, where)
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)


def _check_keywords(node: Mapping[str, Any], where: str) -> None:
    properties = node.get("properties")
    if isinstance(properties, Mapping) and len(properties) > limits.MAX_SCHEMA_PROPERTIES:
        raise RequestError(f"{where}: an object has {len(properties)} properties; at most "
                           f"{limits.MAX_SCHEMA_PROPERTIES} are taken")
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > limits.MAX_SCHEMA_ENUM:
        raise RequestError(f"{where}: an enum has {len(enum)} entries; at most {limits.MAX_SCHEMA_ENUM} are taken")
    for key in COUNTS:
        count = node.get(key)
        if isinstance(count, int | float) and not isinstance(count, bool) and count > limits.MAX_REPETITION:
            raise RequestError(f"{where}: '{key}' is {count}; the grammar takes repetitions of at most "
                               f"{limits.MAX_REPETITION}")
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        for low, high in _QUANTIFIER.findall(pattern):
            if _past_repetition(low) or (high and _past_repetition(high)):
                raise RequestError(f"{where}: a pattern repeats {{{low},{high}}}; the grammar takes repetitions "
                                   f"of at most {limits.MAX_REPETITION}")


def _past_repetition(digits: str) -> bool:
    # compared by length first: int() of thousands of digits is itself refused (and slow)
    return len(digits) > len(str(limits.MAX_REPETITION)) or int(digits) > limits.MAX_REPETITION
