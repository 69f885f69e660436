# A copy of yoco_records/canonical.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""Strict JSON input and RFC 8785 canonical bytes.

Everything that enters the ledger goes through :func:`parse_json_strict` (so the data is
exactly what standard JSON can carry, with no ambiguity) and is stored and hashed as
:func:`canonical_bytes` (RFC 8785, JSON Canonicalization Scheme).

Numbers: JSON integers come back as ``int`` and must lie in ±(2**53 − 1), the range in
which an IEEE 754 double is exact, so every conforming JSON reader sees the same value.
Every other number (a fraction or an exponent, even ``1.0`` or ``1e2``) comes back as
``float``; RFC 8785 writes a float in its shortest round-trip form, so ``1.0`` and ``1e2``
are canonicalised as ``1`` and ``100``. Because of that, floats from 2**53 up to 1e21 in
magnitude are refused too (``1e16`` would be canonicalised as the out-of-range integer
``10000000000000000``): canonical bytes always parse back strictly to the same bytes.
:func:`decimal_of` gives the exact decimal value of such a number, digit for digit the
canonical text.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Sequence
from decimal import Decimal
from json.encoder import encode_basestring as _quote
from typing import Any, NoReturn

import rfc8785

__all__ = [
    "ABSENT",
    "MAX_SAFE_INTEGER",
    "CanonicalizationError",
    "JsonInputError",
    "NotCanonicalError",
    "canonical_bytes",
    "canonical_fields",
    "decimal_of",
    "format_path",
    "parse_canonical",
    "parse_json_strict",
]

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer magnitude accepted in JSON input and canonical output."""

PathPart = str | int

# Floats from 2**53 up to (not including) 1e21 are written by RFC 8785 as plain integers
# ("10000000000000000"), which a strict reader then refuses as out of range: they are
# refused on the way in and on the way out, so canonical bytes always parse back.
_INEXACT_LOW = float(2**53)
_INEXACT_HIGH = 1e21

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A JSON \u escape of a UTF-16 surrogate (the only way a JSON text can smuggle a lone
# surrogate into a Python str). Matches are only a hint; the strings are then checked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def format_path(parts: tuple[PathPart, ...] | list[PathPart], root: str = "$") -> str:
    """Return the JSON path of ``parts`` below ``root``.

    Promises: ``("terms", "covered_classes", 1)`` -> ``$.terms.covered_classes[1]``; keys
    that are not plain identifiers are written as ``["a key"]`` (JSON-quoted); with
    ``root=""`` the leading ``$`` is left out and a leading ``.`` dropped (``gpus``,
    ``[3].gpus``).
    """
    out = [root]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENT.fullmatch(part):
            out.append(f".{part}")
        else:
            out.append(f"[{json.dumps(part, ensure_ascii=False)}]")
    text = "".join(out)
    if not root and text.startswith("."):
        text = text[1:]
    return text


class JsonInputError(ValueError):
    """Input that is not strict JSON.

    ``message`` says what is wrong, ``path`` is the JSON path where it is (``$.gpus``,
    ``$[2].terms``) or ``None`` when the text cannot be parsed that far (then ``line`` and
    ``column``, 1-based, give the position in the text where known). ``parts`` is the path
    as a tuple of keys and indexes.
    """

    def __init__(
        self,
        message: str,
        path: str | None = None,
        *,
        parts: tuple[PathPart, ...] | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(message, path)
        self.message = message
        self.path = path
        self.parts = parts
        self.line = line
        self.column = column

    def __str__(self) -> str:
        if self.path is not None:
            return f"{self.path}: {self.message}"
        if self.line is not None:
            return f"{self.message} at line {self.line} column {self.column}"
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_json_error,
            (self.message, self.path, self.parts, self.line, self.column),
        )


def _rebuild_json_error(
    message: str,
    path: str | None,
    parts: tuple[PathPart, ...] | None,
    line: int | None,
    column: int | None,
) -> JsonInputError:
    return JsonInputError(message, path, parts=parts, line=line, column=column)


class CanonicalizationError(ValueError):
    """A value that RFC 8785 cannot represent (``path`` names where, e.g. ``$.a[0]``)."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message, path)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        if self.path is not None:
            return f"{self.path}: {self.message}"
        return self.message


class NotCanonicalError(ValueError):
    """Strict JSON whose value has a canonical form, but other bytes than that form."""


class _Bad:
    """Placeholder the parse hooks leave where the input holds something refused."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class _BadObject(dict[str, Any]):
    """An object with a duplicate key; the error belongs at ``key`` inside it."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _walk(root: Any) -> Any:
    """Yield ``(parts, value)`` depth first, in document order, without recursion."""
    stack: list[tuple[tuple[PathPart, ...], Any]] = [((), root)]
    while stack:
        parts, value = stack.pop()
        yield parts, value
        children: list[tuple[tuple[PathPart, ...], Any]] = []
        if isinstance(value, dict):
            children = [((*parts, k), v) for k, v in value.items()]
        elif isinstance(value, list | tuple):
            children = [((*parts, i), v) for i, v in enumerate(value)]
        stack.extend(reversed(children))


def _raise_at(parts: tuple[PathPart, ...], message: str) -> None:
    raise JsonInputError(message, format_path(parts), parts=parts)


def _not_utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _DecoderState(threading.local):
    """A thread's strict decoder and whether its last parse met a value to refuse.

    ``json.loads`` with hooks builds a new decoder (and its scanner) on every call, which
    cost more than the parse of a short record line; one decoder a thread is built once.
    The hooks flag what they refuse here, so a clean line is never walked twice.
    """

    found_bad: bool = False
    decoder: json.JSONDecoder | None = None

    def __init__(self) -> None:
        # The flat-object shapes parse_canonical learned in this thread: every one known
        # (by keys and value types) and the few tried first, most recently used first.
        self.shapes: dict[tuple[tuple[str, ...], str], _Shape] = {}
        self.tried: list[_Shape] = []


_STATE = _DecoderState()


def _flag(item: _Bad) -> _Bad:
    _STATE.found_bad = True
    return item


def _on_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                _STATE.found_bad = True
                return _BadObject(pairs, key)
            seen.add(key)
    return obj


def _on_int(digits: str) -> int | _Bad:
    if len(digits.lstrip("-")) <= 16:
        value = int(digits)
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
    return _flag(_Bad(f"integer {_clip(digits)} is outside ±(2^53−1), the exact range of JSON"))


def _on_float(digits: str) -> float | _Bad:
    value = float(digits)
    if math.isinf(value):
        return _flag(_Bad(f"number {_clip(digits)} is too large for a double"))
    if _INEXACT_LOW <= abs(value) < _INEXACT_HIGH:
        return _flag(
            _Bad(
                f"number {_clip(digits)} is beyond ±(2^53−1): its canonical form would be an "
                "integer outside the exact range of JSON"
            )
        )
    return value


def _on_constant(name: str) -> _Bad:
    return _flag(_Bad(f"{name} is not a JSON number"))


def _decoder() -> json.JSONDecoder:
    """This thread's strict decoder (built on its first use)."""
    decoder = _STATE.decoder
    if decoder is None:
        decoder = _STATE.decoder = json.JSONDecoder(
            object_pairs_hook=_on_pairs,
            parse_int=_on_int,
            parse_float=_on_float,
            parse_constant=_on_constant,
        )
    return decoder


def parse_json_strict(text: str | bytes) -> Any:
    """Parse one JSON text (RFC 8259) strictly and return its value.

    Promises: objects come back as ``dict`` (keys in document order), arrays as ``list``,
    JSON integers as ``int`` and all other numbers as ``float``. Raises
    :class:`JsonInputError` (naming the JSON path where there is one) for: bytes that are
    not UTF-8 (a byte order mark included), lone UTF-16 surrogates (``"\\ud800"``),
    syntax errors and anything after the value but whitespace, a key that appears twice
    in one object (at any depth), ``NaN``/``Infinity``/``-Infinity``, integers outside
    ±(2**53 − 1), other numbers from 2**53 up to 1e21 in magnitude (RFC 8785 would write
    them as such integers), numbers too large for a double, and nesting too deep to parse.
    Everything this returns can be passed to :func:`canonical_bytes`.
    """
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        if raw.startswith(b"\xef\xbb\xbf"):
            raise JsonInputError("byte order mark not allowed: JSON text must start at byte 0")
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonInputError(f"invalid UTF-8 at byte {exc.start}") from None
    elif isinstance(text, str):
        s = text
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise JsonInputError(
                f"text holds a character that is not valid Unicode at offset {exc.start}"
            ) from None
        if s.startswith("\ufeff"):
            raise JsonInputError("byte order mark not allowed: JSON text must start at byte 0")
    else:
        raise TypeError(f"parse_json_strict needs str or bytes, not {type(text).__name__}")

    decoder = _decoder()
    _STATE.found_bad = False
    try:
        value = decoder.decode(s)
    except json.JSONDecodeError as exc:
        # Some of Python's messages end in "at" ("Unterminated string starting at"),
        # written for its own ": line 1 column 7 (char 6)"; the position is added by
        # whoever reports this error ("... at column 7"), so the "at" goes here, or the
        # words would read "starting at at column 7".
        raise JsonInputError(
            f"invalid JSON: {exc.msg.removesuffix(' at')}", line=exc.lineno, column=exc.colno
        ) from None
    except RecursionError:
        raise JsonInputError("invalid JSON: nesting too deep") from None

    check_strings = _SURROGATE_ESCAPE.search(s) is not None
    if _STATE.found_bad or check_strings:
        for parts, item in _walk(value):
            if isinstance(item, _BadObject):
                _raise_at((*parts, item.key), f"duplicate key {item.key!r}")
            if isinstance(item, _Bad):
                _raise_at(parts, item.message)
            if check_strings:
                if isinstance(item, str) and _not_utf8(item):
                    _raise_at(parts, "string holds a lone UTF-16 surrogate (not valid Unicode)")
                if isinstance(item, dict):
                    for key in item:
                        if _not_utf8(key):
                            _raise_at(
                                (*parts, key),
                                "key holds a lone UTF-16 surrogate (not valid Unicode)",
                            )
    return value


def _clip(digits: str) -> str:
    return digits if len(digits) <= 40 else digits[:20] + "…" + digits[-10:]


def _unrepresentable(value: Any) -> str | None:
    """Why ``value`` (a scalar or container) cannot be canonicalised, or ``None``."""
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str) and _not_utf8(value):
            return "string holds a lone UTF-16 surrogate (not valid Unicode)"
        return None
    if isinstance(value, int):
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return None
        return f"integer {value} is outside ±(2^53−1)"
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"{value} is not representable in JSON"
        if _INEXACT_LOW <= abs(value) < _INEXACT_HIGH:
            return f"{value!r} is an integer beyond ±(2^53−1) once canonicalised"
        return None
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                return f"object key {key!r} is not a string"
        return None
    if isinstance(value, list | tuple):
        return None
    return f"unsupported type {type(value).__name__} (only JSON types can be canonicalised)"


class _Slow(Exception):
    """The fast serialiser met something it leaves to the reference implementation."""


#: A string as RFC 8785 writes it: quoted, with JSON's minimal escapes (the standard
#: library's C encoder; the tests hold the whole encoding equal to the rfc8785 package).
quote = _quote


def ecma_float(value: float) -> str:
    """ECMAScript Number.prototype.toString of a finite float (RFC 8785 section 3.2.2.3).

    Python's ``repr`` gives the shortest round-trip digits, as ECMAScript requires; only
    the layout (where the point goes, when to use an exponent) differs.
    """
    if value == 0:
        return "0"
    text = repr(value)
    if "e" not in text:
        # Positional already (1e-4 <= |value| < 1e16): the same shortest digits laid out
        # as ECMAScript does, but for Python's ".0" on integral values.
        return text[:-2] if text.endswith(".0") else text
    if value < 0:
        return "-" + ecma_float(-value)
    mantissa, _, exp = text.partition("e")
    point = mantissa.find(".")
    if point < 0:
        point = len(mantissa)
    digits = mantissa.replace(".", "")
    n = point + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    n -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    sign = "+" if e > 0 else "-"
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(e)}"


def _jcs(obj: Any) -> str:
    """RFC 8785 text of plain JSON values; raises _Slow for anything unusual."""
    kind = type(obj)
    if kind is str:
        return _quote(obj)
    if kind is dict:
        keys = list(obj)
        for key in keys:
            # Code point order equals UTF-16 order for ASCII keys; others go the slow way.
            if type(key) is not str or not key.isascii():
                raise _Slow
        keys.sort()
        # Strings and safe integers inline: records are flat objects of them, and a call
        # per value was a third of the canonicalisation time. Anything else recurses.
        parts = []
        for key in keys:
            value = obj[key]
            vt = type(value)
            if vt is str:
                parts.append(_quote(key) + ":" + _quote(value))
            elif vt is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
                parts.append(_quote(key) + ":" + int.__repr__(value))
            else:
                parts.append(_quote(key) + ":" + _jcs(value))
        return "{" + ",".join(parts) + "}"
    if kind is int:
        if -MAX_SAFE_INTEGER <= obj <= MAX_SAFE_INTEGER:
            return int.__repr__(obj)
        raise _Slow
    if kind is list:
        return "[" + ",".join([_jcs(item) for item in obj]) + "]"
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if kind is float and math.isfinite(obj) and not _INEXACT_LOW <= abs(obj) < _INEXACT_HIGH:
        return ecma_float(obj)
    raise _Slow


def canonical_bytes(obj: Any) -> bytes:
    """Return the RFC 8785 (JCS) canonical UTF-8 bytes of ``obj``.

    Promises: keys sorted by their UTF-16 code units, no whitespace, strings with the
    minimal escapes, integers written as is, floats in the ECMAScript shortest round-trip
    form (``1.0`` -> ``1``, ``100.0`` -> ``100``, ``1e21`` -> ``1e+21``, ``-0.0`` -> ``0``);
    equal JSON values give equal bytes, and the bytes are accepted by
    :func:`parse_json_strict`. Accepts ``None``, ``bool``, ``int``, ``float``, ``str``,
    ``list``/``tuple`` and ``dict`` with ``str`` keys; raises :class:`CanonicalizationError`
    naming the JSON path for anything else: integers outside ±(2**53 − 1), floats from
    2**53 up to 1e21 in magnitude (JCS writes them as integers beyond that range), NaN and
    infinities, non-string keys, lone surrogates, other types (``Decimal``, ``datetime``,
    sets...).
    """
    try:
        # Fast path for plain JSON values (what parse_json_strict returns); the tests hold
        # it byte-equal to the rfc8785 package, which does everything else.
        return _jcs(obj).encode("utf-8")
    except (_Slow, UnicodeEncodeError, RecursionError):
        pass
    try:
        for parts, item in _walk(obj):
            reason = _unrepresentable(item)
            if reason is not None:
                raise CanonicalizationError(reason, format_path(parts))
        return rfc8785.dumps(obj)
    except RecursionError:
        raise CanonicalizationError("value nested too deeply") from None
    except rfc8785.CanonicalizationError as exc:
        raise CanonicalizationError(str(exc)) from None


def decimal_of(number: int | float) -> Decimal:
    """Return the exact decimal value of a JSON number as the ledger stores it.

    Promises: for an ``int``, ``Decimal(number)``; for a finite ``float``, the decimal
    written by its RFC 8785 canonical text (the shortest round-trip digits, so
    ``decimal_of(0.1) == Decimal("0.1")``, ``decimal_of(2.50) == Decimal("2.5")``,
    ``decimal_of(1.0) == Decimal("1")``) -- never the binary expansion. Raises
    ``TypeError`` for ``bool`` and non-numbers, ``ValueError`` for NaN and infinities.
    """
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise TypeError(f"decimal_of needs an int or float, not {type(number).__name__}")
    if isinstance(number, int):
        return Decimal(number)
    if not math.isfinite(number):
        raise ValueError(f"{number} is not a finite number")
    if not _INEXACT_LOW <= abs(number) < _INEXACT_HIGH:
        # The canonical fast path's layout (held equal to rfc8785's by the tests).
        return Decimal(ecma_float(number))
    return Decimal(rfc8785.dumps(number).decode("ascii"))


class _Undecided(Exception):
    """The fast check of :func:`parse_canonical` cannot decide; the full rule will."""


def _fast_int(text: str) -> int:
    # Python writes any integer; RFC 8785 only those within ±(2**53 − 1).
    if len(text) > 17:
        raise _Undecided
    value = int(text)
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise _Undecided
    return value


def _fast_float(text: str) -> float:
    # Python's repr and RFC 8785 lay out a float alike but for an exponent ("1e+16",
    # "1e-07") or an integral value ("1.0", "-0.0", "9007199254740992.0"): re-encoded
    # bytes equal to such a text would not prove it canonical, so the full rule decides.
    if text.endswith(".0") or "e" in text or "E" in text:
        raise _Undecided
    return float(text)


def _fast_constant(name: str) -> NoReturn:
    raise _Undecided


_FAST_DECODER = json.JSONDecoder(
    parse_int=_fast_int, parse_float=_fast_float, parse_constant=_fast_constant
)
_FAST_ENCODER = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)
_UNDECIDED = object()


def _fast_parse(text: str) -> Any:
    """The value of ``text`` (ASCII) when the standard library's C parser and encoder
    prove it canonical, else :data:`_UNDECIDED` (never a wrong "canonical").

    ASCII keys sort alike by code point and by UTF-16 code unit, and ASCII text holds no
    lone surrogate the encoder would write raw.  Strings are quoted by the same function
    as :func:`canonical_bytes` quotes them; integers outside ±(2**53 − 1), NaN and
    infinities, and every float Python lays out other than RFC 8785 are left undecided by
    the parse hooks.  A key twice, white space, another key order, an escape the
    canonical form does not use: each makes the re-encoding differ, and so undecided.
    """
    try:
        value, end = _FAST_DECODER.raw_decode(text)
        if end == len(text) and _FAST_ENCODER.encode(value) == text:
            return value
    except (ValueError, _Undecided, RecursionError):
        pass
    return _UNDECIDED


# A flat object of plain values, as canonical text, matched by one regular expression:
# a shape is learned from an entry the C check proved canonical (its keys, in their
# canonical order, and each value's type), and every later entry of that shape is then
# checked by the expression alone, which admits only canonical text:
# - a key or string of printable ASCII but '"' and '\' is written as itself, quoted;
# - an integer of at most 15 digits (inside ±(2**53 − 1)), no leading zero, no "-0";
# - a fraction of at most 9 + 6 digits, its last one not 0, at least 0.000001: a decimal
#   of at most 15 significant digits is the shortest that reads back as its double (15
#   digits survive the round trip, so no shorter decimal reads as the same double), and
#   RFC 8785 writes a number from 1e-6 up to 1e21 without an exponent, as here;
# - true, false, null.
_SIMPLE_TEXT = r"[ !#-\[\]-~]*"
_SIMPLE = re.compile(_SIMPLE_TEXT)
_VALUE_PATTERN = {
    "s": f'"({_SIMPLE_TEXT})"',
    "i": r"(0|-?[1-9][0-9]{0,14})",
    "f": r"(-?(?:0|[1-9][0-9]{0,8})\.[0-9]{0,5}[1-9])",
    "b": r"(true|false)",
    "n": r"(null)",
}
#: Shapes known to a thread at most (each a compiled expression), and tried per entry.
_MAX_SHAPES = 64
_TRIED_SHAPES = 4


class _Shape:
    """One learned shape: its expression and how to read each captured value."""

    __slots__ = ("bools", "floats", "ints", "keys", "kinds", "lines", "nulls", "regex")

    def __init__(self, keys: tuple[str, ...], kinds: str) -> None:
        self.keys = keys
        self.kinds = kinds
        body = (
            "{"
            + ",".join(
                f'"{re.escape(k)}":{_VALUE_PATTERN[t]}' for k, t in zip(keys, kinds, strict=True)
            )
            + "}"
        )
        self.regex = re.compile(body)
        # Many entries at once, one to a line: a line of this shape gives its values and
        # an empty last group; any other line, only the last group (the line and its end).
        self.lines = re.compile(f"^{body}$|^(.*\n)", re.MULTILINE)
        self.ints = [k for k, t in zip(keys, kinds, strict=True) if t == "i"]
        self.floats = [k for k, t in zip(keys, kinds, strict=True) if t == "f"]
        self.bools = [k for k, t in zip(keys, kinds, strict=True) if t == "b"]
        self.nulls = [k for k, t in zip(keys, kinds, strict=True) if t == "n"]

    def parse(self, text: str) -> Any:
        """What ``json.loads(text)`` returns when ``text`` has this shape, else
        :data:`_UNDECIDED`."""
        m = self.regex.fullmatch(text)
        if m is None:
            return _UNDECIDED
        out = dict(zip(self.keys, m.groups(), strict=True))
        for k in self.ints:
            out[k] = int(out[k])
        for k in self.floats:
            out[k] = float(out[k])
        for k in self.bools:
            out[k] = out[k] == "true"
        for k in self.nulls:
            out[k] = None
        return out

    def rows(self, entries: Sequence[bytes]) -> list[tuple[str, ...]] | None:
        """One row per entry: an entry of this shape (its whole line matched) gives its
        values' texts and ``""`` last; any other, ``""`` for each value and its line
        last.  None when an entry holds a line break (the lines would not be entries)."""
        text = b"\n".join(entries).decode("latin-1") + "\n"
        if text.count("\n") != len(entries):
            return None
        rows: list[tuple[str, ...]] = self.lines.findall(text)
        return rows if len(rows) == len(entries) else None

    def column(self, columns: list[tuple[str, ...]], key: str) -> Sequence[Any]:
        """The values of ``key`` in rows' ``columns`` (from :meth:`rows`), as json reads
        them (``ABSENT`` when the shape has no such key)."""
        if key not in self.keys:
            return (ABSENT,) * len(columns[-1])
        i = self.keys.index(key)
        texts = columns[i]
        kind = self.kinds[i]
        if kind == "s":
            return texts
        if kind == "i":
            return [int(x) if x else x for x in texts]
        if kind == "f":
            return [float(x) if x else x for x in texts]
        if kind == "b":
            return [x == "true" for x in texts]
        return [None] * len(texts)


def _shape_parse(text: str) -> Any:
    """The value of ``text`` when a learned shape matches it, else :data:`_UNDECIDED`."""
    tried = _STATE.tried
    for i, shape in enumerate(tried):
        value = shape.parse(text)
        if value is not _UNDECIDED:
            if i:
                tried.insert(0, tried.pop(i))
            return value
    return _UNDECIDED


def _learn(value: Any) -> None:
    """Learn the shape of ``value`` (proved canonical) when it is a flat object of plain
    values; it is then tried first."""
    if type(value) is not dict or not value:
        return
    kinds = []
    for key, item in value.items():
        if not _SIMPLE.fullmatch(key):
            return
        t = type(item)
        if t is str:
            if not _SIMPLE.fullmatch(item):
                return
            kinds.append("s")
        elif t is int:
            kinds.append("i")
        elif t is float:
            kinds.append("f")
        elif t is bool:
            kinds.append("b")
        elif item is None:
            kinds.append("n")
        else:
            return
    sig = (tuple(value), "".join(kinds))
    known = _STATE.shapes
    shape = known.get(sig)
    if shape is None:
        if len(known) >= _MAX_SHAPES:
            return
        shape = known[sig] = _Shape(*sig)
    tried = _STATE.tried
    if shape in tried:
        tried.remove(shape)
    tried.insert(0, shape)
    del tried[_TRIED_SHAPES:]


def _full_parse(data: bytes) -> Any:
    """:func:`parse_canonical` by the full rule: parsed, canonicalised, compared."""
    try:
        value = json.loads(data)
        same = canonical_bytes(value) == bytes(data)
    except (ValueError, CanonicalizationError, RecursionError):
        same = False
    if same:
        return value
    # Refused: parsed strictly, to say why (a key twice, a number JSON cannot carry).
    strict = parse_json_strict(data)
    canonical_bytes(strict)
    raise NotCanonicalError("its bytes are not its RFC 8785 canonical form")


def parse_canonical(data: bytes, *, fast: bool = True) -> Any:
    """Return the JSON value of ``data``, which must be byte for byte its own canonical form.

    Promises: the rule is ``data == canonical_bytes(json.loads(data))``; when it holds,
    returns what ``json.loads(data)`` returns (fractions as ``float``). Otherwise raises
    :class:`JsonInputError` when ``data`` is not strict JSON (:func:`parse_json_strict`'s
    reason, e.g. a key twice), :class:`CanonicalizationError` when its value has no
    canonical form, else :class:`NotCanonicalError`. Two fast checks accept most
    canonical entries: a flat object of a shape seen before by one regular expression,
    any other ASCII text by the standard library's C parser and encoder; whatever they
    cannot prove canonical goes to the full rule, so the verdict and the reason are the
    full rule's either way (``fast=False`` applies the full rule alone; the tests
    compare).
    """
    if fast:
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            pass
        else:
            value = _shape_parse(text)
            if value is not _UNDECIDED:
                return value
            value = _fast_parse(text)
            if value is not _UNDECIDED:
                _learn(value)
                return value
    return _full_parse(data)


class _Absent:
    """The value :func:`canonical_fields` gives for a field an entry does not have."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
"""What :func:`canonical_fields` gives for a field an entry does not have."""

#: Entries checked together by :func:`canonical_fields`.
_CHUNK = 4096


def _fields(value: Any, fields: tuple[str, ...]) -> tuple[Any, ...]:
    if type(value) is not dict:
        return (ABSENT,) * len(fields)
    return tuple(value.get(f, ABSENT) for f in fields)


def canonical_fields(
    entries: Sequence[bytes], fields: tuple[str, ...]
) -> list[tuple[Any, ...]] | None:
    """For each entry held to :func:`parse_canonical`'s rule, the values of ``fields``.

    Promises: when every entry is byte for byte its canonical form, returns for each (in
    order) the tuple of its values of ``fields`` as ``parse_canonical`` reads them
    (:data:`ABSENT` where the entry is not an object or has no such key); None as soon as
    one is not (then :func:`parse_canonical`, entry by entry, says which and why).
    Entries of the shape most of the last ones had are checked many at a time, by the
    shape's expression over their lines (one call for thousands of entries); any other
    entry by :func:`parse_canonical` itself.
    """
    out: list[tuple[Any, ...]] = []
    bulk: _Shape | None = None
    for lo in range(0, len(entries), _CHUNK):
        chunk = entries[lo : lo + _CHUNK]
        if bulk is None and _STATE.tried:
            bulk = _STATE.tried[0]
        rows = bulk.rows(chunk) if bulk is not None else None
        if bulk is None or rows is None:
            try:
                out.extend(_fields(parse_canonical(e), fields) for e in chunk)
            except ValueError:
                return None
            continue
        columns = list(zip(*rows, strict=True))
        got = list(zip(*(bulk.column(columns, f) for f in fields), strict=True))
        others = [j for j, line in enumerate(columns[-1]) if line]
        for j in others:
            try:
                got[j] = _fields(parse_canonical(chunk[j]), fields)
            except ValueError:
                return None
        out.extend(got)
        if len(others) * 2 > len(chunk):
            bulk = None  # most were of another shape: the one most recently used next
    return out
