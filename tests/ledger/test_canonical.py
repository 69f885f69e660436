"""Strict JSON parsing and RFC 8785 canonical bytes (ledger.canonical)."""

from __future__ import annotations

import math
import pickle
from datetime import datetime
from decimal import Decimal

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.canonical import (
    MAX_SAFE_INTEGER,
    CanonicalizationError,
    JsonInputError,
    canonical_bytes,
    decimal_of,
    format_path,
    parse_json_strict,
)


def refused(text: str | bytes) -> JsonInputError:
    with pytest.raises(JsonInputError) as info:
        parse_json_strict(text)
    return info.value


# --------------------------------------------------------------------- parse: accepted


def test_parses_standard_json_with_python_types() -> None:
    value = parse_json_strict(b'{"a": [1, -2, 1.5, 1.0, 1e2, "x", true, false, null], "b": {}}')
    assert value == {"a": [1, -2, 1.5, 1.0, 100.0, "x", True, False, None], "b": {}}
    items = value["a"]
    assert [type(v) for v in items[:5]] == [int, int, float, float, float]


def test_accepts_str_and_surrounding_whitespace() -> None:
    assert parse_json_strict(' \t\r\n{"a": 1}\n ') == {"a": 1}


def test_keys_keep_document_order() -> None:
    assert list(parse_json_strict('{"z": 1, "a": 2, "m": 3}')) == ["z", "a", "m"]


def test_integer_boundary_accepted() -> None:
    assert parse_json_strict(str(MAX_SAFE_INTEGER)) == 2**53 - 1
    assert parse_json_strict(str(-MAX_SAFE_INTEGER)) == -(2**53) + 1


def test_surrogate_pair_escape_accepted() -> None:
    assert parse_json_strict('"\\ud83d\\ude00"') == "\U0001f600"


def test_underflow_to_zero_is_a_rounding_not_an_error() -> None:
    assert parse_json_strict("1e-400") == 0.0


def test_same_key_in_sibling_objects_is_fine() -> None:
    assert parse_json_strict('[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]


# --------------------------------------------------------------------- parse: refused


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('{"a": 1, "a": 1}', "$.a"),
        ('{"a": {"b": 1, "c": 2, "b": 3}}', "$.a.b"),
        ('{"list": [{"x": 1}, {"x": 1, "x": 2}]}', "$.list[1].x"),
        ('[[[{"deep": {"k": 1, "k": 2}}]]]', "$[0][0][0].deep.k"),
        ('{"a b": {"c": 1, "c": 1}}', '$["a b"].c'),
    ],
)
def test_duplicate_keys_refused_at_any_depth(text: str, path: str) -> None:
    err = refused(text)
    assert err.path == path
    assert "duplicate key" in err.message


@pytest.mark.parametrize(
    ("text", "path", "word"),
    [
        ('{"gpus": NaN}', "$.gpus", "NaN"),
        ('{"x": [1, Infinity]}', "$.x[1]", "Infinity"),
        ('{"x": -Infinity}', "$.x", "-Infinity"),
    ],
)
def test_nan_and_infinity_refused(text: str, path: str, word: str) -> None:
    err = refused(text)
    assert err.path == path
    assert word in err.message


@pytest.mark.parametrize(
    "number",
    [str(2**53), str(-(2**53)), "123456789012345678901234567890", "9" * 5000],
)
def test_integers_outside_2_53_refused(number: str) -> None:
    err = refused(f'{{"n": [0, {number}]}}')
    assert err.path == "$.n[1]"
    assert "2^53" in err.message


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1" * 400 + ".0"])
def test_float_overflow_refused(number: str) -> None:
    err = refused(f'{{"f": {number}}}')
    assert err.path == "$.f"
    assert "too large" in err.message


@pytest.mark.parametrize(
    "data",
    [b'{"a": "\xff"}', b'{"a": "\xc3"}', b'"\xed\xa0\x80"', b"\xef\xbb\xbf{}"],
)
def test_invalid_utf8_and_bom_refused(data: bytes) -> None:
    err = refused(data)
    assert err.path is None


def test_lone_surrogate_escape_refused_with_path() -> None:
    err = refused('{"a": ["ok", "\\ud800"]}')
    assert err.path == "$.a[1]"
    assert "surrogate" in err.message


def test_lone_surrogate_in_key_refused() -> None:
    err = refused('{"\\udc00": 1}')
    assert "surrogate" in err.message


def test_lone_surrogate_in_str_input_refused() -> None:
    err = refused('{"a": "\ud800"}')
    assert "not valid Unicode" in err.message


@pytest.mark.parametrize(
    "text",
    ['{"a": 1} x', '{"a": 1}{"b": 2}', "[1] ]", "1 2", '"a" "b"', "{}\x0c"],
)
def test_trailing_garbage_refused(text: str) -> None:
    err = refused(text)
    assert err.path is None
    assert err.line == 1
    assert err.column is not None


@pytest.mark.parametrize(
    "text",
    ["", "   ", "{'a': 1}", '{"a": 1,}', "[1,]", '{"a" 1}', "01", "+1", ".5", "tru", '"a\nb"'],
)
def test_non_standard_syntax_refused(text: str) -> None:
    refused(text)


def test_syntax_error_names_position() -> None:
    err = refused('{\n  "a": 1,\n  "b": }')
    assert (err.line, err.column) == (3, 8)
    assert str(err).endswith("at line 3 column 8")


def test_deep_nesting_is_an_input_error_not_a_crash() -> None:
    err = refused("[" * 100_000 + "]" * 100_000)
    assert "nesting" in err.message


def test_non_text_input_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        parse_json_strict(12)  # type: ignore[arg-type]


def test_json_input_error_is_value_error_and_pickles() -> None:
    err = refused('{"a": NaN}')
    assert isinstance(err, ValueError)
    assert str(err) == "$.a: NaN is not a JSON number"
    again = pickle.loads(pickle.dumps(err))
    assert (again.message, again.path, again.parts) == (err.message, err.path, err.parts)


def test_format_path() -> None:
    assert format_path(("terms", "covered_classes", 1)) == "$.terms.covered_classes[1]"
    assert format_path(("gpus",), root="") == "gpus"
    assert format_path((3, "gpus"), root="") == "[3].gpus"
    assert format_path(("a-b",), root="") == '["a-b"]'
    assert format_path(()) == "$"


# --------------------------------------------------------------------- canonical bytes


def test_canonical_sorts_keys_and_drops_whitespace() -> None:
    a = canonical_bytes({"b": 1, "a": {"y": [1, 2], "x": None}})
    b = canonical_bytes(parse_json_strict('{ "a" : { "x" : null , "y" : [ 1 , 2 ] } , "b" : 1 }'))
    assert a == b == b'{"a":{"x":null,"y":[1,2]},"b":1}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", b"1"),
        ("1.0", b"1"),
        ("1.50", b"1.5"),
        ("1e2", b"100"),
        ("1E+2", b"100"),
        ("100e-2", b"1"),
        ("-0", b"0"),
        ("-0.0", b"0"),
        ("0.1", b"0.1"),
        ("1e21", b"1e+21"),
        ("0.000001", b"0.000001"),
        ("1e-7", b"1e-7"),
        ("123e-20", b"1.23e-18"),
        ("5e-324", b"5e-324"),
        ("1.7976931348623157e308", b"1.7976931348623157e+308"),
        ("333333333.33333329", b"333333333.3333333"),
        ("9007199254740991", b"9007199254740991"),
        ("-9007199254740991", b"-9007199254740991"),
    ],
)
def test_canonical_number_formatting(text: str, expected: bytes) -> None:
    assert canonical_bytes(parse_json_strict(text)) == expected
    assert rfc8785.dumps(parse_json_strict(text)) == expected


def test_rfc8785_sample_from_the_rfc() -> None:
    text = (
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        ' "literals": [null, true, false]}'
    )
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    ).encode()
    assert canonical_bytes(parse_json_strict(text)) == expected


def test_canonical_key_order_is_utf16_code_units() -> None:
    # RFC 8785 section 3.2.3 example: U+1F600 (a surrogate pair) sorts before U+FB33.
    obj = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    out = canonical_bytes(obj).decode()
    order = [out.index(f'"{v}"') for v in obj.values()]
    names = [v for _, v in sorted(zip(order, obj.values(), strict=True))]
    assert names == [
        "Carriage Return",
        "One",
        "Control",
        "Latin Small Letter O With Diaeresis",
        "Euro Sign",
        "Emoji: Grinning Face",
        "Hebrew Letter Dalet With Dagesh",
    ]


def test_canonical_string_escapes() -> None:
    assert canonical_bytes('a"\\\n\t\x01\x7f\u00e9/') == b'"a\\"\\\\\\n\\t\\u0001\x7f\xc3\xa9/"'


def test_canonical_is_stable_across_spellings() -> None:
    one = parse_json_strict('{"gpus": 8, "step_seconds": 1.50, "x": [1.0, 10E1]}')
    two = parse_json_strict('{"x":[1,100],"step_seconds":15e-1,"gpus":8}')
    assert canonical_bytes(one) == canonical_bytes(two)
    assert canonical_bytes(one) == b'{"gpus":8,"step_seconds":1.5,"x":[1,100]}'


def test_canonical_accepts_tuples_and_int_subclasses_like_the_reference() -> None:
    assert canonical_bytes((1, True, None)) == b"[1,true,null]"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": 2**53}, "$.a"),
        ({"a": [1, -(2**53)]}, "$.a[1]"),
        ({"a": [1, {"b": math.nan}]}, "$.a[1].b"),
        ({"a": math.inf}, "$.a"),
        ({"a": Decimal("1.5")}, "$.a"),
        ({"a": {1, 2}}, "$.a"),
        ({"a": datetime(2025, 1, 1)}, "$.a"),
        ({"a": {1: "x"}}, "$.a"),
        ({"a": "\ud800"}, "$.a"),
    ],
)
def test_canonical_refuses_what_jcs_cannot_represent(value: object, path: str) -> None:
    with pytest.raises(CanonicalizationError) as info:
        canonical_bytes(value)
    assert info.value.path == path
    assert isinstance(info.value, ValueError)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


def _has_big_float(value: object) -> bool:
    if isinstance(value, float):
        return 2.0**53 <= abs(value) < 1e21
    if isinstance(value, list):
        return any(_has_big_float(v) for v in value)
    if isinstance(value, dict):
        return any(_has_big_float(v) for v in value.values())
    return False


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_canonical_bytes_equal_the_rfc8785_package(value: object) -> None:
    try:
        expected = rfc8785.dumps(value)  # type: ignore[arg-type]
    except rfc8785.CanonicalizationError:
        expected = None
    if expected is None or _has_big_float(value):
        with pytest.raises(CanonicalizationError):
            canonical_bytes(value)
        return
    assert canonical_bytes(value) == expected


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_layout_equals_the_rfc8785_package(value: float) -> None:
    if 2.0**53 <= abs(value) < 1e21:
        with pytest.raises(CanonicalizationError):
            canonical_bytes(value)
        return
    assert canonical_bytes(value) == rfc8785.dumps(value)
    assert decimal_of(value) == Decimal(canonical_bytes(value).decode())


@pytest.mark.parametrize("text", ["1e16", "9007199254740992.0", "-1.5e20", "9.99e20"])
def test_floats_that_would_canonicalise_to_big_integers_are_refused(text: str) -> None:
    err = refused(f'{{"x": {text}}}')
    assert err.path == "$.x"
    with pytest.raises(CanonicalizationError) as info:
        canonical_bytes({"x": float(text)})
    assert info.value.path == "$.x"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9007199254740991.0", b"9007199254740991"), ("1e21", b"1e+21"), ("-1e21", b"-1e+21")],
)
def test_floats_at_the_edges_of_the_refused_range(text: str, expected: bytes) -> None:
    data = canonical_bytes(parse_json_strict(text))
    assert data == expected
    assert canonical_bytes(parse_json_strict(data)) == data


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_canonical_text_parses_back_to_the_same_bytes(value: object) -> None:
    try:
        data = canonical_bytes(value)
    except CanonicalizationError:
        return
    assert canonical_bytes(parse_json_strict(data)) == data


# --------------------------------------------------------------------- decimal_of


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (0.1, "0.1"),
        (1.0, "1"),
        (2.50, "2.5"),
        (100.0, "100"),
        (1e21, "1E+21"),
        (1e-7, "1E-7"),
        (0.000001, "0.000001"),
        (-3.25, "-3.25"),
        (7, "7"),
        (2**53 - 1, "9007199254740991"),
    ],
)
def test_decimal_of_is_exact_and_matches_canonical_text(number: float, text: str) -> None:
    value = decimal_of(number)
    assert str(value) == text
    assert value == Decimal(canonical_bytes(number).decode())


def test_decimal_of_is_not_the_binary_expansion() -> None:
    assert decimal_of(0.1) == Decimal("0.1")
    assert decimal_of(0.1) != Decimal.from_float(0.1)


def test_decimal_of_refuses_bool_nan_and_non_numbers() -> None:
    with pytest.raises(TypeError):
        decimal_of(True)
    with pytest.raises(TypeError):
        decimal_of("1.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        decimal_of(math.nan)
    with pytest.raises(ValueError):
        decimal_of(math.inf)


def test_a_refused_value_does_not_leak_into_the_next_parse() -> None:
    # The decoder is built once a thread and its hooks flag refused values in the
    # thread's state, reset at every call: a clean text after a refused one is clean.
    assert "duplicate key" in str(refused('{"a": 1, "a": 2}'))
    assert parse_json_strict('{"a": 1, "b": [1.5, 2]}') == {"a": 1, "b": [1.5, 2]}
    assert "NaN" in str(refused("[NaN]"))
    assert parse_json_strict("[1]") == [1]
    with pytest.raises(JsonInputError):
        parse_json_strict("[")  # a syntax error midway through
    assert parse_json_strict('{"x": {"y": 2}}') == {"x": {"y": 2}}


def test_threads_parsing_at_once_each_get_their_own_verdicts() -> None:
    import threading

    texts = [
        (f'{{"n": {i}}}', {"n": i}) if i % 3 else (f'{{"n": {i}, "n": 0}}', None)
        for i in range(3000)
    ]
    wrong: list[str] = []

    def work(offset: int) -> None:
        for k in range(len(texts)):
            text, want = texts[(k + offset) % len(texts)]
            try:
                got = parse_json_strict(text)
            except JsonInputError as exc:
                if want is not None or "duplicate key 'n'" not in str(exc):
                    wrong.append(f"{text}: {exc}")
                continue
            if got != want:
                wrong.append(f"{text}: {got!r}")

    threads = [threading.Thread(target=work, args=(n * 7,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
