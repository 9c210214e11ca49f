"""Mutations of IR text: byte, token, line, type, attribute, nesting and crossover.

Each mutation takes the input (bytes, possibly not UTF-8), a second input to borrow from
(crossover, lines and tokens of another file) and a ``random.Random``, and returns the
mutated bytes. :func:`mutate` applies one to three of them, chosen at random.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

_ENCODING = {"encoding": "utf-8", "errors": "surrogateescape"}  # keeps bytes that are not UTF-8

# MLIR-ish tokens: string literals, SSA values, symbols, attribute and type aliases,
# identifiers, numbers, arrows and single punctuation
_TOKEN = re.compile(
    r'"(?:[^"\\\n]|\\.)*"|[%@^#!]?[A-Za-z_][\w$.-]*|%\d+|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?|->|\S'
)
_TENSOR_TYPE = re.compile(r"tensor<([0-9x?]*)([a-z][a-z0-9]*)>")
_INTEGER = re.compile(r"(?<![\w.%#@^])-?\d+(?![\w.])")
_ATTRIBUTE = re.compile(r"\{[^{}\n]*\}|#graph\.sharding<[^\n]*?>(?=[,)}\s])|dense<[^<>\n]*>")

INTERESTING_NUMBERS = (
    "0", "1", "-1", "2", "3", "7", "16", "255", "256", "-256", "65536", "2147483648",
    "4294967296", "99999999999", "9223372036854775807", "-9223372036854775808",
    "18446744073709551616", "99999999999999999999", "1.0e308", "-0.0", "0x7FC00000",
)  # fmt: skip
ELEMENT_TYPES = ("f32", "f16", "bf16", "f64", "i1", "i8", "i32", "i64", "index", "si32", "f8E4M3FN")
INTERESTING_TOKENS = (
    *INTERESTING_NUMBERS, *ELEMENT_TYPES, '""', '"\\"', '"\\xff"', "tensor<0xf32>",
    "tensor<?xf32>", "tensor<f32>", "tensor<99999999999x99999999999xf32>", "!schedule.buffer<0>",
    "!schedule.handle<tensor<4xf32>>", "!tile.ptr<f32>", "@mesh", "@nowhere", "dp", "tp", "pp",
    "%0", "%x", "{", "}", "(", ")", "[", "]", "<", ">", ",", ":", "=", "->", "true", "unit",
    "loc(unknown)", "#graph.sharding<@mesh, [[dp]]>", "dense<1.0>", "schedule.yield",
    "func.return", "tile.return",
)  # fmt: skip

Mutation = Callable[[bytes, bytes, random.Random], bytes]


def _text(data: bytes) -> str:
    return data.decode(**_ENCODING)


def _bytes(text: str) -> bytes:
    return text.encode(**_ENCODING)


# --- bytes ---------------------------------------------------------------------------


def byte_mutation(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """Flips, inserts or deletes one byte (special bytes are likelier than others)."""
    position = rng.randrange(len(data) + 1)
    byte = rng.choice([rng.randrange(256), 0xFF, 0x00, 0x0A, 0x22, 0x5C, 0x7B, 0x7D, 0x80])
    action = rng.choice(("flip", "insert", "delete"))
    if action == "insert" or position == len(data):
        return data[:position] + bytes([byte]) + data[position:]
    if action == "delete":
        return data[:position] + data[position + 1 :]
    return (
        data[:position] + bytes([data[position] ^ (1 << rng.randrange(8))]) + data[position + 1 :]
    )


# --- tokens ------------------------------------------------------------------------------


def token_mutation(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """Replaces, deletes, duplicates or swaps tokens; replacements come from both inputs
    and from :data:`INTERESTING_TOKENS`."""
    text = _text(data)
    tokens = list(_TOKEN.finditer(text))
    if not tokens:
        return data
    target = rng.choice(tokens)
    start, end = target.span()
    action = rng.choice(("replace", "replace", "delete", "duplicate", "swap"))
    if action == "delete":
        return _bytes(text[:start] + text[end:])
    if action == "duplicate":
        return _bytes(text[:end] + " " + target.group() + text[end:])
    if action == "swap":
        second = rng.choice(tokens)
        (a, b), (c, d) = sorted([target.span(), second.span()])
        if b > c:
            return data
        return _bytes(text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:])
    pool = _TOKEN.findall(_text(other)) + _TOKEN.findall(text)
    replacement = (
        rng.choice(INTERESTING_TOKENS) if rng.random() < 0.5 or not pool else rng.choice(pool)
    )
    return _bytes(text[:start] + replacement + text[end:])


def replace_all_mutation(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """Replaces every occurrence of one number or name (so that the input stays
    consistent: a dim that changes everywhere, a renamed value or mesh axis)."""
    text = _text(data)
    words = sorted(set(re.findall(r"(?<![\w.])(?:[%@]?[A-Za-z_]\w*|\d+)(?![\w.])", text)))
    if not words:
        return data
    word = rng.choice(words)
    numbers = ("0", "1", "3", "5", "64", "1024", "65536", "99999999999")
    if word.isdigit():
        new = rng.choice(numbers)
    else:  # a name of the same kind: a value for a value, a symbol for a symbol
        kind = word[0] if word[0] in "%@" else ""
        names = [
            t for t in _TOKEN.findall(_text(other) + text) if t[0] not in '%@#!^"' or t[0] == kind
        ]
        names = [t for t in names if (t[0] == kind if kind else t[0].isalpha()) and t != word]
        new = rng.choice(names) if names else word
    if word.isdigit():  # also as a dim of a type: tensor<4x8xf32>
        pattern = r"(?:(?<![\w.%#])|(?<=\dx))" + word + r"(?![\d.])"
    else:
        pattern = r"(?<![\w.%@])" + re.escape(word) + r"(?![\w.])"
    return _bytes(re.sub(pattern, lambda _: new, text))


# --- lines ------------------------------------------------------------------------------


def line_mutation(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """Deletes, duplicates, swaps or moves a line (moving one above its uses makes a use
    before definition), or takes a line of the other input."""
    lines = data.split(b"\n")
    index = rng.randrange(len(lines))
    action = rng.choice(("delete", "duplicate", "swap", "move", "borrow"))
    if action == "delete":
        del lines[index]
    elif action == "duplicate":
        lines.insert(index, lines[index])
    elif action == "swap" and index + 1 < len(lines):
        lines[index], lines[index + 1] = lines[index + 1], lines[index]
    elif action == "move":
        line = lines.pop(index)
        lines.insert(max(0, min(len(lines), index + rng.randint(-5, 5))), line)
    elif action == "borrow":
        lines.insert(index, rng.choice(other.split(b"\n")))
    return b"\n".join(lines)


# --- types and attributes ---------------------------------------------------------------


def type_mutation(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """Changes a tensor type: a dim's size, the rank, or the element type."""
    text = _text(data)
    types = list(_TENSOR_TYPE.finditer(text))
    if not types:
        return token_mutation(data, other, rng)
    match = rng.choice(types)
    dims = [d for d in match.group(1).split("x") if d]
    element = match.group(2)
    action = rng.choice(("size", "size", "add", "drop", "element"))
    if action == "size" and dims:
        dims[rng.randrange(len(dims))] = rng.choice(
            ("0", "1", "2", "3", "5", "?", "65536", "99999999999", "4294967297")
        )
    elif action == "add":
        dims.insert(rng.randrange(len(dims) + 1), rng.choice(("1", "2", "4", "0")))
    elif action == "drop" and dims:
        del dims[rng.randrange(len(dims))]
    else:
        element = rng.choice(ELEMENT_TYPES)
    shape = "".join(f"{d}x" for d in dims)
    return _bytes(text[: match.start()] + f"tensor<{shape}{element}>" + text[match.end() :])


def attribute_mutation(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """Changes a number or a name inside an attribute dictionary, a sharding or a dense
    value, or drops or repeats one of its entries."""
    text = _text(data)
    spans = list(_ATTRIBUTE.finditer(text))
    if not spans:
        return token_mutation(data, other, rng)
    match = rng.choice(spans)
    body = match.group()
    action = rng.choice(("number", "number", "name", "entry"))
    if action == "number" and (numbers := list(_INTEGER.finditer(body))):
        number = rng.choice(numbers)
        body = body[: number.start()] + rng.choice(INTERESTING_NUMBERS) + body[number.end() :]
    elif action == "entry" and body.startswith("{") and "," in body:
        entries = body[1:-1].split(",")
        index = rng.randrange(len(entries))
        if rng.random() < 0.5:
            del entries[index]
        else:
            entries.insert(index, entries[index])
        body = "{" + ",".join(entries) + "}"
    else:
        names = list(re.finditer(r"(?<=[\[\s,@])[A-Za-z_]\w*", body))
        if names:
            name = rng.choice(names)
            new = rng.choice(("dp", "tp", "pp", "sp", "mesh", "nowhere", "sum", "max", "x", "tanh"))
            body = body[: name.start()] + new + body[name.end() :]
    return _bytes(text[: match.start()] + body + text[match.end() :])


# --- nesting and crossover ----------------------------------------------------------------


def nesting_mutation(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """Inserts deep nesting (brackets, types, regions) or a long literal at a token."""
    text = _text(data)
    tokens = list(_TOKEN.finditer(text)) or [None]
    target = rng.choice(tokens)
    position = target.start() if target is not None else 0
    depth = rng.choice((10, 100, 1000, 3000))
    opener, closer = rng.choice(
        (("[", "]"), ("(", ")"), ("{", "}"), ("<", ">"), ("tensor<", ">"), ("[[", "]]"),
         ("schedule.microbatch {index = 0, count = 1} {\n", "schedule.yield\n}\n"),
         ('"', '"'))
    )  # fmt: skip
    closed = rng.random() < 0.7
    inserted = opener * depth + (closer * depth if closed else "")
    if opener == '"':
        inserted = '"' + "\\a" * depth + ('"' if closed else "")
    return _bytes(text[:position] + inserted + text[position:])


def crossover(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """The first lines of one input and the last of the other, or a run of the other's
    lines inserted into this one."""
    mine, theirs = data.split(b"\n"), other.split(b"\n")
    if rng.random() < 0.5:
        return b"\n".join(
            mine[: rng.randrange(len(mine) + 1)] + theirs[rng.randrange(len(theirs) + 1) :]
        )
    start = rng.randrange(len(theirs))
    run = theirs[start : start + rng.randint(1, 12)]
    at = rng.randrange(len(mine) + 1)
    return b"\n".join(mine[:at] + run + mine[at:])


MUTATIONS: dict[str, tuple[Mutation, int]] = {  # name -> (mutation, weight)
    "byte": (byte_mutation, 2),
    "token": (token_mutation, 5),
    "replace-all": (replace_all_mutation, 3),
    "line": (line_mutation, 4),
    "type": (type_mutation, 3),
    "attribute": (attribute_mutation, 3),
    "nesting": (nesting_mutation, 1),
    "crossover": (crossover, 2),
}


def mutate(data: bytes, other: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    """``data`` after one to three mutations, and the mutations' names."""
    names = rng.choices(
        list(MUTATIONS), weights=[w for _, w in MUTATIONS.values()], k=rng.choice((1, 1, 2, 3))
    )
    for name in names:
        data = MUTATIONS[name][0](data, other, rng)
    return data, names
