"""The Python client's models (``yoco.client``) against the OpenAPI schema the portal
serves (``/api/openapi.json``, built from ``web.schemas``): each dataclass mirrors the
object of the operation it is read from, field for field -- the same names, every one
required (the client reads each with ``d[name]``), the same JSON type, null allowed on
both sides or on neither. A drift on either side fails here naming the model and the
field, instead of a ``KeyError`` in a customer's script. No database: the schema is
built from the app's routes alone.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from yoco import client as C

#: Each client model, the GET operation it is read from and where the object is in that
#: operation's 200 answer ("": the answer itself; "[]": each item of an array;
#: "items[]": each of the page's ``items``).
MIRRORS: list[tuple[type, str, str]] = [
    (C.Contract, "/api/v1/contracts", "[]"),
    (C.Contract, "/api/v1/contracts/{contract_id}", ""),
    (C.SlaFigures, "/api/v1/contracts/{contract_id}/sla", ""),
    (C.Failure, "/api/v1/contracts/{contract_id}/failures", "items[]"),
    (C.Checkpoint, "/api/v1/contracts/{contract_id}/checkpoints", "[]"),
]

#: Client fields that are no field of the object (SlaFigures.data: the whole object).
WHOLE_OBJECT = "whole_object"

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", bool: "boolean",
                               float: "number", datetime: "string", dict: "object",
                               list: "array"}


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from web.app import create_app
    from web.settings import WebSettings
    from yoco.app import App
    from yoco.settings import Settings

    data = tmp_path_factory.mktemp("client-schema")
    app = create_app(App(Settings(data_dir=Path(data))), WebSettings(secret_key="x"))
    schema: dict[str, Any] = app.openapi()
    return schema


def _resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    name = ref.rsplit("/", 1)[-1]
    return typing.cast(dict[str, Any], spec["components"]["schemas"][name])


def _object_schema(spec: dict[str, Any], path: str, where: str) -> dict[str, Any]:
    op = spec["paths"][path]["get"]
    node = _resolve(spec, op["responses"]["200"]["content"]["application/json"]["schema"])
    if where == "[]":
        assert node.get("type") == "array", f"{path}: answers {node}, not an array"
        node = _resolve(spec, node["items"])
    elif where == "items[]":
        node = _resolve(spec, node["properties"]["items"]["items"])
    return node


def _client_type(hint: Any) -> tuple[set[str], bool, bool]:
    """The JSON types a client annotation takes, whether it takes null, and whether it
    wants an ISO date-time."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or \
        typing.get_origin(hint) is typing.Union else (hint,)
    nullable = type(None) in args
    kinds = set()
    wants_datetime = False
    for arg in args:
        if arg is type(None):
            continue
        base = typing.get_origin(arg) or arg
        kinds.add(_JSON_TYPES[base])
        wants_datetime |= base is datetime
    return kinds, nullable, wants_datetime


def _schema_type(spec: dict[str, Any],
                 prop: dict[str, Any]) -> tuple[set[str], bool, set[str]]:
    """The JSON types a property's schema allows, whether null is one, and its formats."""
    options = prop.get("anyOf", [prop])
    kinds: set[str] = set()
    formats: set[str] = set()
    for option in [_resolve(spec, o) for o in options]:
        kind = option.get("type")
        if kind is not None:
            kinds.add(kind)
        if "format" in option:
            formats.add(option["format"])
    nullable = "null" in kinds
    return kinds - {"null"}, nullable, formats


def _drift(model: type, path: str, obj: dict[str, Any],
           spec: dict[str, Any] | None = None) -> list[str]:
    name = f"yoco.client.{model.__name__}"
    hints = typing.get_type_hints(model)
    mine = {f.name for f in dataclasses.fields(model) if not f.metadata.get(WHOLE_OBJECT)}
    props: dict[str, Any] = obj.get("properties", {})
    required = set(obj.get("required", []))
    problems = [f"{name}.{f}: the client reads it, the API ({path}) does not declare it"
                for f in sorted(mine - set(props))]
    problems += [f"{name}: no field {f}, which the API ({path}) declares"
                 for f in sorted(set(props) - mine)]
    for f in sorted(mine & set(props)):
        kinds, nullable, wants_dt = _client_type(hints[f])
        s_kinds, s_nullable, formats = _schema_type(spec or {}, props[f])
        if f not in required:
            problems.append(f"{name}.{f}: the client reads it always, the API ({path}) "
                            f"may leave it out (not required)")
        if kinds != s_kinds:
            problems.append(f"{name}.{f}: the client takes {sorted(kinds)}, the API "
                            f"({path}) sends {sorted(s_kinds)}")
        if nullable != s_nullable:
            problems.append(f"{name}.{f}: null is {'' if nullable else 'not '}allowed by "
                            f"the client, {'' if s_nullable else 'not '}by the API ({path})")
        if wants_dt and "date-time" not in formats:
            problems.append(f"{name}.{f}: the client parses a date-time, the API ({path}) "
                            f"promises only a string")
    return problems


@pytest.mark.parametrize("model, path, where", MIRRORS,
                         ids=[f"{m.__name__}:{p}" for m, p, _ in MIRRORS])
def test_the_client_model_mirrors_the_api_schema(openapi: dict[str, Any], model: type,
                                                 path: str, where: str) -> None:
    problems = _drift(model, path, _object_schema(openapi, path, where), openapi)
    assert not problems, "\n".join(problems)


def test_every_client_model_is_checked() -> None:
    models = {obj for obj in vars(C).values()
              if isinstance(obj, type) and dataclasses.is_dataclass(obj)}
    assert models == {m for m, _, _ in MIRRORS}


def test_a_drift_is_named() -> None:
    # The check itself: a renamed field, a type changed, null allowed on one side only.
    obj = {"properties": {"tree_size": {"type": "string"}, "root": {"type": "string"},
                          "origin": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                          "signed_at": {"type": "string", "format": "date-time"},
                          "note": {"type": "string"}},
           "required": ["tree_size", "root", "origin", "signed_at"]}
    problems = "\n".join(_drift(C.Checkpoint, "/x", obj))
    assert "Checkpoint.root_hash: the client reads it, the API (/x) does not declare" \
        in problems
    assert "Checkpoint: no field root, which the API (/x) declares" in problems
    assert "Checkpoint.tree_size: the client takes ['integer'], the API (/x) sends " \
        "['string']" in problems
    assert "Checkpoint.origin: null is not allowed by the client, by the API" in problems
    assert "Checkpoint.note: the client reads it always, the API (/x) may leave it out" \
        in problems
