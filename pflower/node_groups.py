"""Several clients per simulated SuperNode (``simulated-clients``): who a node serves, and the
message that carries a phase's messages for all of them.

Flower's simulation engine costs about the same per message whatever the message holds (a pass
of its queue, a Ray hand-off, the node's context shipped both ways), so a phase of N clients on G
nodes costs about G hand-offs instead of N. Node ``g`` of ``G`` serves the clients ``g``,
``g + G``, ``g + 2G``, ... below N: any run of consecutive client ids (a phase's messages go in
client order, a window of them at a time) spreads over every node. Each client keeps its own
context (its records under its id in the node's), its own seed, data and state file, so the
numbers are those of one client per node.

The wire format, both ways: each client's records under ``"<client id>/<name>"``, and a
:data:`GROUP` config record listing the clients and their messages' types (a training for some,
an evaluation for others). A record a message gives several clients (the same global model)
travels once; the others name it (``alias``/``alias-of``). A reply says, for a client whose
message failed, its error code and reason, as Flower would have answered it alone. A
:data:`GROUP` record with ``members`` asks a node which clients it serves.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, Metadata, RecordDict

#: What Flower answers a query to a ClientApp without a query handler (a quickstart-style one, not pflower's).
NO_QUERY_HANDLER = "No query function registered"
#: The config record that marks a message as one for several clients.
GROUP = "pflower.group"
SEPARATOR = "/"


def members(node: int, nodes: int, clients: int) -> list[int]:
    """The clients node ``node`` of ``nodes`` serves when they share ``clients``: every ``nodes``-th from ``node``."""
    return list(range(node, clients, nodes))


def members_query() -> RecordDict:
    """The content that asks a node which clients it serves."""
    return RecordDict({GROUP: ConfigRecord({"members": True})})


def is_group(content: RecordDict) -> bool:
    return GROUP in content.config_records


def asks_members(content: RecordDict) -> bool:
    return bool(content.config_records[GROUP].get("members", False))


def members_reply(clients: list[int]) -> RecordDict:
    return RecordDict({GROUP: ConfigRecord({"clients": clients} if clients else {})})


def pack(contents: Iterable[tuple[int, str, RecordDict]]) -> RecordDict:
    """One content for the clients' ``contents`` (client id, its message's type, its message's
    content), in their order; a record object two clients share goes once."""
    packed, header = RecordDict(), {"clients": [], "types": [], "alias": [], "alias-of": []}
    first: dict[int, str] = {}  # id(record) -> the name it travels under
    for cid, kind, content in contents:
        header["clients"].append(cid)
        header["types"].append(kind)
        for name, record in content.items():
            key = f"{cid}{SEPARATOR}{name}"
            if isinstance(record, ArrayRecord) and id(record) in first:
                header["alias"].append(key)
                header["alias-of"].append(first[id(record)])
                continue
            first.setdefault(id(record), key)
            packed[key] = record
    packed[GROUP] = ConfigRecord({k: v for k, v in header.items() if v})
    return packed


def unpack(content: RecordDict) -> dict[int, RecordDict]:
    """Each client's content of a packed one, by client id, in the packed order."""
    header = content.config_records[GROUP]
    out = {int(cid): RecordDict() for cid in header.get("clients", [])}
    for key, record in content.items():
        if key == GROUP:
            continue
        cid, _, name = key.partition(SEPARATOR)
        out[int(cid)][name] = record
    for key, of in zip(header.get("alias", []), header.get("alias-of", [])):
        cid, _, name = str(key).partition(SEPARATOR)
        out[int(cid)][name] = content[str(of)]
    return out


def types(content: RecordDict) -> dict[int, str]:
    """Each client's message type in a packed content, by client id."""
    header = content.config_records[GROUP]
    return {int(cid): str(kind) for cid, kind in zip(header.get("clients", []), header.get("types", []))}


def pack_replies(replies: Iterable[tuple[int, Message]]) -> RecordDict:
    """One reply content for the clients' ``replies``: their contents, and the errors of those whose message failed."""
    replies = list(replies)
    packed = pack((cid, r.metadata.message_type, r.content) for cid, r in replies if not r.has_error())
    errors = [(cid, r.error) for cid, r in replies if r.has_error()]
    header = {k: v for k, v in packed[GROUP].items() if k != "types"}  # a reply's type is its message's
    header["clients"] = [cid for cid, _ in replies]
    if errors:
        header |= {"error-clients": [c for c, _ in errors], "error-codes": [int(e.code) for _, e in errors],
                   "error-reasons": [str(e.reason) for _, e in errors]}  # fmt: skip
    packed[GROUP] = ConfigRecord(header)
    return packed


def split_reply(reply: Message) -> dict[int, RecordDict | Error]:
    """Each client's reply content, or its error, of a packed reply, by client id."""
    header = reply.content.config_records[GROUP]
    errors = {int(c): Error(code=int(code), reason=str(why))
              for c, code, why in zip(header.get("error-clients", []), header.get("error-codes", []), header.get("error-reasons", []))}  # fmt: skip
    contents = unpack(reply.content)
    return {int(cid): errors[int(cid)] if int(cid) in errors else contents.get(int(cid), RecordDict()) for cid in header.get("clients", [])}


def with_content(msg: Message, content: RecordDict | Error, **metadata) -> Message:
    """A message with ``msg``'s metadata (changed by ``metadata``) and ``content`` (or an error)."""
    m = msg.metadata
    fields = dict(run_id=m.run_id, message_id=m.message_id, src_node_id=m.src_node_id, dst_node_id=m.dst_node_id,
                  reply_to_message_id=m.reply_to_message_id, group_id=m.group_id, created_at=m.created_at, ttl=m.ttl,
                  message_type=m.message_type)  # fmt: skip
    meta = Metadata(**(fields | metadata))
    return Message(error=content, metadata=meta) if isinstance(content, Error) else Message(content=content, metadata=meta)
