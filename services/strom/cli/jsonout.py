"""The ``--json`` output of the CLI: protobuf answers as plain JSON objects.

``json_format`` on its own leaves out fields at their default (partition 0, offset 0, lag 0,
empty lists), so a script has to know the defaults to read ``d["partition"]``, and it quotes
64-bit integers (ProtoJSON's rule for JavaScript's doubles), so offsets arrive as strings.
Here every field is printed and 64-bit integers are JSON numbers (Python's json keeps them
exact; a consumer that parses numbers as doubles loses precision only above 2**53).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def message_dict(msg: Message) -> dict[str, Any]:
    """``msg`` as a JSON-ready dict: proto field names, every field, integers as numbers."""
    d = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _unquote(msg.DESCRIPTOR, d)
    return d


def message_json(msg: Message) -> str:
    """:func:`message_dict` as indented JSON text (what ``--json`` prints)."""
    return json.dumps(message_dict(msg), indent=2)


def _unquote(desc: Descriptor, d: dict[str, Any]) -> None:
    """Turn the quoted 64-bit integers of ``d`` (``desc``'s JSON form) back into numbers."""
    for f in desc.fields:
        if f.name not in d:
            continue
        value = d[f.name]
        mt = f.message_type
        if mt is not None and mt.GetOptions().map_entry:
            vf = mt.fields_by_name["value"]
            if vf.type in _INT64:
                d[f.name] = {k: int(v) for k, v in value.items()}
            elif vf.message_type is not None and not _well_known(vf.message_type):
                for v in value.values():
                    _unquote(vf.message_type, v)
        elif mt is not None:
            if not _well_known(mt):
                for v in value if f.is_repeated else (value,):
                    _unquote(mt, v)
        elif f.type in _INT64:
            d[f.name] = [int(v) for v in value] if f.is_repeated else int(value)


def _well_known(desc: Descriptor) -> bool:
    """google.protobuf types (Timestamp, Struct, ...) have JSON forms of their own."""
    return desc.full_name.startswith("google.protobuf.")
