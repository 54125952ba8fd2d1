"""Parse a ``config.pbtxt`` with Triton's own schema, for the Triton export tests. Test-only.

``model_config.proto`` is vendored unchanged (license header kept) from
github.com/triton-inference-server/common, ``protobuf/model_config.proto`` at commit
83adf7cf88a2f343005974dff3728be746de2d66. No ``protoc`` is installed here, so :func:`file_descriptor`
reads the subset of proto3 that file uses (messages, enums, nesting, ``repeated``, ``map<K, V>``,
``oneof``; no imports or options, refused if met) into a ``FileDescriptorProto``; protobuf's own
descriptor pool then checks it (types resolve, numbers are unique) and ``text_format`` parses with it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

PROTO = Path(__file__).with_name("model_config.proto")
F = descriptor_pb2.FieldDescriptorProto
SCALARS = {"double": F.TYPE_DOUBLE, "float": F.TYPE_FLOAT, "int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64,
           "int32": F.TYPE_INT32, "uint32": F.TYPE_UINT32, "bool": F.TYPE_BOOL, "string": F.TYPE_STRING,
           "bytes": F.TYPE_BYTES, "sint32": F.TYPE_SINT32, "sint64": F.TYPE_SINT64, "fixed32": F.TYPE_FIXED32,
           "fixed64": F.TYPE_FIXED64, "sfixed32": F.TYPE_SFIXED32, "sfixed64": F.TYPE_SFIXED64}  # fmt: skip
TOKEN = re.compile(r'"[^"]*"|[A-Za-z_][A-Za-z0-9_.]*|-?\d+|[{}=;<>,]')


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items = TOKEN.findall(re.sub(r"//[^\n]*", "", text))
        self.i = 0

    def next(self) -> str:
        self.i += 1
        return self.items[self.i - 1]

    def peek(self) -> str:
        return self.items[self.i]

    def expect(self, token: str) -> None:
        got = self.next()
        if got != token:
            raise ValueError(f"expected {token!r}, got {got!r} at token {self.i}")


def file_descriptor(text: str) -> descriptor_pb2.FileDescriptorProto:
    tokens = _Tokens(text)
    fdp = descriptor_pb2.FileDescriptorProto(name="model_config.proto", syntax="proto3")
    while tokens.i < len(tokens.items):
        word = tokens.next()
        if word == "syntax":
            tokens.expect("=")
            assert tokens.next() == '"proto3"'
            tokens.expect(";")
        elif word == "package":
            fdp.package = tokens.next()
            tokens.expect(";")
        elif word == "message":
            _message(tokens, fdp.message_type.add())
        elif word == "enum":
            _enum(tokens, fdp.enum_type.add())
        else:
            raise ValueError(f"unsupported top-level statement {word!r}")
    _resolve(fdp)
    return fdp


def _enum(tokens: _Tokens, enum: descriptor_pb2.EnumDescriptorProto) -> None:
    enum.name = tokens.next()
    tokens.expect("{")
    while (name := tokens.next()) != "}":
        tokens.expect("=")
        enum.value.add(name=name, number=int(tokens.next()))
        tokens.expect(";")


def _message(tokens: _Tokens, msg: descriptor_pb2.DescriptorProto) -> None:
    msg.name = tokens.next()
    tokens.expect("{")
    while (word := tokens.peek()) != "}":
        if word == "message":
            tokens.next()
            _message(tokens, msg.nested_type.add())
        elif word == "enum":
            tokens.next()
            _enum(tokens, msg.enum_type.add())
        elif word == "oneof":
            tokens.next()
            index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=tokens.next())
            tokens.expect("{")
            while tokens.peek() != "}":
                _field(tokens, msg, oneof=index)
            tokens.next()
        elif word in ("option", "reserved", "import", "extensions"):
            raise ValueError(f"{word!r} is outside the proto3 subset this parser reads")
        else:
            _field(tokens, msg)
    tokens.next()


def _field(tokens: _Tokens, msg: descriptor_pb2.DescriptorProto, oneof: int | None = None) -> None:
    words = []
    while (token := tokens.next()) != ";":
        words.append(token)
    field = msg.field.add(label=F.LABEL_OPTIONAL)
    if words[0] == "map":  # map < K , V > name = N
        key, value, name, number = words[2], words[4], words[6], words[8]
        entry = msg.nested_type.add(name="".join(p.capitalize() for p in name.split("_")) + "Entry")
        entry.options.map_entry = True
        for i, (n, t) in enumerate((("key", key), ("value", value)), start=1):
            _typed(entry.field.add(name=n, number=i, label=F.LABEL_OPTIONAL), t)
        field.name, field.number, field.label = name, int(number), F.LABEL_REPEATED
        field.type, field.type_name = F.TYPE_MESSAGE, entry.name
        return
    if words[0] == "repeated":
        field.label = F.LABEL_REPEATED
        words = words[1:]
    if len(words) != 4 or words[2] != "=":
        raise ValueError(f"cannot read field {' '.join(words)!r} in {msg.name}")
    field.name, field.number = words[1], int(words[3])
    _typed(field, words[0])
    if oneof is not None:
        field.oneof_index = oneof


def _typed(field: Any, type_name: str) -> None:
    if type_name in SCALARS:
        field.type = SCALARS[type_name]
    else:
        field.type_name = type_name  # resolved to a full name by _resolve (message or enum)


def _resolve(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    """Each type reference to its full name, looked up from the innermost scope outwards (proto's rule)."""
    kinds: dict[str, int] = {}

    def collect(prefix: str, messages: Any, enums: Any) -> None:
        for e in enums:
            kinds[f"{prefix}.{e.name}"] = F.TYPE_ENUM
        for m in messages:
            kinds[f"{prefix}.{m.name}"] = F.TYPE_MESSAGE
            collect(f"{prefix}.{m.name}", m.nested_type, m.enum_type)

    def fix(scope: str, messages: Any) -> None:
        for m in messages:
            inner = f"{scope}.{m.name}"
            for field in m.field:
                if field.type_name and not field.type_name.startswith("."):
                    parts = inner.split(".")
                    for cut in range(len(parts), 0, -1):
                        candidate = ".".join(parts[:cut]) + "." + field.type_name
                        if candidate in kinds:
                            field.type_name, field.type = candidate, kinds[candidate]
                            break
                    else:
                        raise ValueError(f"unknown type {field.type_name!r} in {inner}")
            fix(inner, m.nested_type)

    root = f".{fdp.package}"
    collect(root, fdp.message_type, fdp.enum_type)
    fix(root, fdp.message_type)


_CLASS: Any = None


def model_config_class() -> Any:
    """Triton's ``inference.ModelConfig`` message class, built once from the vendored .proto."""
    global _CLASS
    if _CLASS is None:
        pool = descriptor_pool.DescriptorPool()
        pool.Add(file_descriptor(PROTO.read_text()))
        _CLASS = message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))
    return _CLASS


def parse(text: str) -> Any:
    """A ``config.pbtxt`` parsed as Triton parses it (unknown fields and bad values raise ``ParseError``)."""
    return text_format.Parse(text, model_config_class()())
