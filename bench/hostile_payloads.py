"""What the hostile suite sends: each function returns one request (an ``Abuse``) of its kind,
a variant picked at random. Bodies are raw bytes (JSON text written by hand, so NaN, huge
integers, lone surrogates and broken syntax reach the server exactly as written)."""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.hostile_llm import POISON_MARKER

JSON = ("Content-Type", "application/json")


def token() -> str:
    """A unique tag carried by every message the suite may get acknowledged (duplicate check)."""
    return f"tok:{secrets.token_hex(8)}"


@dataclass(frozen=True)
class Abuse:
    kind: str
    variant: str
    method: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    chunked: bool = False
    # Which tenant's key goes in X-API-Key: "a", "b", "c", or "" for none (headers may carry
    # their own Authorization / X-API-Key).
    auth: str = "a"
    # A 2xx is a finding (the README says the service refuses it).
    must_refuse: bool = True
    # ...except a 200 empty context: what a conversation the caller cannot see reads as.
    empty_context_ok: bool = False
    # A raw request head to send instead of one built from method/target/headers.
    raw_head: bytes | None = None
    # Bytes of the body to actually send when the declared length is a lie (None: all of it).
    send_limit: int | None = None


@dataclass
class Context:
    """What the generators may use: the body limit and ids seen so far."""

    max_body: int
    a_conversations: list[str] = field(default_factory=list)
    a_memories: list[int] = field(default_factory=list)
    counter: int = 0

    def cid(self, prefix: str) -> str:
        self.counter += 1
        return f"hx-{prefix}-{self.counter}"


def round_body(messages: list[str], metadata: str | None = None) -> bytes:
    """A POST .../messages body from message JSON texts and an optional metadata JSON text."""
    text = '{"messages":[' + ",".join(messages) + "]"
    if metadata is not None:
        text += ',"metadata":' + metadata
    return (text + "}").encode("utf-8", errors="surrogatepass")


def message(content: str, role: str = "user", metadata: str | None = None) -> str:
    extra = f',"metadata":{metadata}' if metadata is not None else ""
    return f'{{"role":"{role}","content":{content}{extra}}}'


def nested(depth: int, kind: str, leaf: str) -> str:
    if kind == "array":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


_DEEP_100K = nested(100_000, "array", "1")
_BIG_INT = "1" + "0" * 5000  # past Python's 4300-digit int parsing limit


# ---- hostile JSON: values the README says are refused (422), and valid edge cases ------------


def hostile_json(ctx: Context, rng: random.Random) -> Abuse:
    tag = token()
    refused_content = {
        "nan": '{"x": NaN}',
        "nan_bare": "NaN",
        "infinity": "[Infinity]",
        "neg_infinity": '{"x": -Infinity}',
        "float_overflow": '{"x": 1e400}',
        "int_2_64": '{"x": 18446744073709551616}',
        "int_below_min": '{"x": -9223372036854775809}',
        "int_5000_digits": '{"x": ' + _BIG_INT + "}",
        "lone_high_surrogate": '"abc \\ud800 def"',
        "lone_low_surrogate": '["\\udfff"]',
        "surrogate_key": '{"\\ud800": 1}',
        "nul": '"a\\u0000b"',
        "blank": '"   "',
        "empty": '""',
        "number": "5",
        "null": "null",
        "bool": "true",
        "deep_arrays_65": nested(65, "array", "1"),
        "deep_objects_65": nested(65, "object", "1"),
        "deep_arrays_100k": _DEEP_100K,
    }
    refused_metadata = {
        "meta_nan": '{"k": NaN}',
        "meta_inf": '{"k": Infinity}',
        "meta_int_2_64": '{"k": 18446744073709551616}',
        "meta_nested": '{"k": {"n": 1}}',
        "meta_list_value": '{"k": [1]}',
        "meta_empty_key": '{"": 1}',
        "meta_long_key": '{"' + "k" * 101 + '": 1}',
        "meta_long_value": '{"k": "' + "v" * 1001 + '"}',
        "meta_surrogate_key": '{"\\ud800": 1}',
        "meta_surrogate_value": '{"k": "\\udbff"}',
        "meta_nul": '{"k": "\\u0000"}',
        "meta_array": "[1, 2]",
        "meta_string": '"labels"',
        "meta_65_keys": "{" + ",".join(f'"k{i}": {i}' for i in range(65)) + "}",
        "meta_deep_100": '{"k": ' + nested(100, "object", "1") + "}",
    }
    accepted = {
        "deep_arrays_64": nested(63, "array", f'"{tag}"'),
        "deep_objects_64": nested(63, "object", f'"{tag}"'),
        "surrogate_pair": f'"{tag} \\ud83d\\ude00 ok"',
        "int_max": f'{{"t": "{tag}", "x": 9223372036854775807, "y": -9223372036854775808}}',
        "float_max": f'{{"t": "{tag}", "x": 1.7976931348623157e308, "y": 5e-324}}',
        "duplicate_keys": f'{{"t": "{tag}", "a": 1, "a": 2}}',
        "escapes": f'"{tag} \\"quoted\\" \\\\ \\/ \\b\\f\\n\\r\\t"',
    }
    pick = rng.random()
    cid = "hx-json"
    if pick < 0.55:
        variant, content = rng.choice(list(refused_content.items()))
        return Abuse(
            "hostile_json",
            variant,
            "POST",
            f"/conversations/{cid}/messages",
            (JSON,),
            round_body([message(content)]),
        )
    if pick < 0.85:
        variant, meta = rng.choice(list(refused_metadata.items()))
        if rng.random() < 0.5:
            body = round_body([message(f'"{tag}"')], metadata=meta)
        else:
            variant = "message_" + variant
            body = round_body([message(f'"{tag}"', metadata=meta)])
        return Abuse("hostile_json", variant, "POST", f"/conversations/{cid}/messages", (JSON,), body)
    variant, content = rng.choice(list(accepted.items()))
    return Abuse(
        "hostile_json",
        "valid_" + variant,
        "POST",
        f"/conversations/{cid}-valid/messages",
        (JSON,),
        round_body([message(content)]),
        must_refuse=False,
    )


# ---- malformed bodies and wrong shapes -------------------------------------------------------


def malformed(ctx: Context, rng: random.Random) -> Abuse:
    tag = token()
    refused: dict[str, bytes] = {
        "truncated": b'{"messages": [{"role": "user", "content": "x"',
        "open_array": b'{"messages": [',
        "trailing_comma": b'{"messages": [{"role": "user", "content": "x"},]}',
        "single_quotes": b"{'messages': []}",
        "garbage": bytes(rng.getrandbits(8) for _ in range(256)),
        "invalid_utf8": b'{"messages": [{"role": "user", "content": "\xff\xfe bad"}]}',
        "json_null": b"null",
        "json_array": b"[]",
        "json_string": b'"messages"',
        "json_empty_object": b"{}",
        "messages_empty": b'{"messages": []}',
        "messages_object": b'{"messages": {}}',
        "messages_null": b'{"messages": null}',
        "role_admin": round_body([message('"x"', role="admin")]),
        "role_missing": b'{"messages": [{"content": "x"}]}',
        "content_missing": b'{"messages": [{"role": "user"}]}',
        "extra_field": b'{"messages": [{"role": "user", "content": "x", "admin": true}]}',
        "extra_top_field": b'{"messages": [{"role": "user", "content": "x"}], "tenant": "b"}',
        "messages_101": round_body([message('"x"')] * 101),
        "content_100001_chars": round_body([message('"' + "x" * 100_001 + '"')]),
        "two_documents": b'{"messages": []} {"messages": []}',
        "nul_byte_raw": b'{"messages": [{"role": "user", "content": "a\x00b"}]}',
    }
    target = "/conversations/hx-malformed/messages"
    pick = rng.random()
    if pick < 0.8:
        variant, body = rng.choice(list(refused.items()))
        return Abuse("malformed", variant, "POST", target, (JSON,), body)
    if pick < 0.87:  # an empty body with a JSON content type
        return Abuse("malformed", "empty_body", "POST", target, (JSON,), b"")
    if pick < 0.93:  # no content type: a 415, like text/plain (any answer but a 5xx)
        return Abuse(
            "malformed",
            "no_content_type",
            "POST",
            "/conversations/hx-malformed-ct/messages",
            (),
            round_body([message(f'"{tag}"')]),
            must_refuse=False,
        )
    if pick < 0.97:
        return Abuse(
            "malformed",
            "text_plain",
            "POST",
            "/conversations/hx-malformed-ct/messages",
            (("Content-Type", "text/plain"),),
            round_body([message(f'"{tag}"')]),
            must_refuse=False,
        )
    # A UTF-8 BOM before valid JSON (json.loads of bytes accepts it).
    return Abuse(
        "malformed",
        "utf8_bom",
        "POST",
        "/conversations/hx-malformed-bom/messages",
        (JSON,),
        b"\xef\xbb\xbf" + round_body([message(f'"{tag}"')]),
        must_refuse=False,
    )


# ---- bodies over MEMORY_MAX_BODY_BYTES, with and without a key -------------------------------


class Bodies:
    """Large bodies, built once."""

    def __init__(self, max_body: int, million: int) -> None:
        self.max_body = max_body
        self.over = b'{"messages": [{"role": "user", "content": "' + b"x" * max_body + b'"}]}'
        item = b'{"role":"user","content":"x"}'
        self.million = b'{"messages":[' + b",".join([item] * million) + b"]}"
        fit = (max_body - 64) // (len(item) + 1)
        self.fit_valid = b'{"messages":[' + b",".join([item] * fit) + b"]}"
        self.fit_valid_count = fit
        empties = (max_body - 64) // 3
        self.fit_empty = b'{"messages":[' + b",".join([b"{}"] * empties) + b"]}"
        self.fit_empty_count = empties
        keys = (max_body - 200) // 16
        self.fit_keys = (
            b'{"messages":[{"role":"user","content":"x",'
            + b",".join(b'"k%07d":0' % i for i in range(keys))
            + b"}]}"
        )
        self.fit_keys_count = keys


def oversized(ctx: Context, rng: random.Random, bodies: Bodies) -> Abuse:
    target = f"/conversations/{ctx.cid('big')}/messages"
    pick = rng.randrange(8)
    if pick == 0:
        return Abuse("oversized", "content_length", "POST", target, (JSON,), bodies.over)
    if pick == 1:
        return Abuse("oversized", "chunked", "POST", target, (JSON,), bodies.over, chunked=True)
    if pick == 2:  # a declared length of a terabyte, 256 KiB of it actually sent
        return Abuse(
            "oversized",
            "declared_terabyte",
            "POST",
            target,
            (JSON, ("Content-Length", str(10**12))),
            bodies.over,
            send_limit=256 * 1024,
        )
    if pick == 3:
        return Abuse(
            "oversized",
            "declared_40_digits",
            "POST",
            target,
            (JSON, ("Content-Length", "9" * 40)),
            bodies.over,
            send_limit=64 * 1024,
        )
    if pick == 4:
        return Abuse("oversized", "create_conversation", "POST", "/conversations", (JSON,), bodies.over)
    if pick == 5:  # a GET with a body over the limit
        return Abuse(
            "oversized",
            "get_with_body",
            "GET",
            f"/conversations/{ctx.cid('big')}/context",
            (JSON,),
            bodies.over,
        )
    if pick == 6:
        return Abuse(
            "oversized",
            "ops_summarize",
            "POST",
            f"/ops/conversations/{ctx.cid('big')}/summarize",
            (JSON,),
            bodies.over,
            chunked=True,
        )
    return Abuse(
        "oversized",
        "chunked_small_chunks",
        "POST",
        target,
        (JSON,),
        bodies.over[: ctx.max_body + 4096],
        chunked=True,
    )


def unauthenticated(ctx: Context, rng: random.Random, bodies: Bodies) -> Abuse:
    target = f"/conversations/{ctx.cid('unauth')}/messages"
    pick = rng.randrange(5)
    if pick == 0:  # under the limit: refused before a byte is read
        return Abuse("unauth_large", "under_limit", "POST", target, (JSON,), bodies.fit_valid, auth="")
    if pick == 1:
        return Abuse("unauth_large", "over_limit", "POST", target, (JSON,), bodies.over, auth="")
    if pick == 2:
        return Abuse("unauth_large", "chunked", "POST", target, (JSON,), bodies.over, chunked=True, auth="")
    if pick == 3:
        return Abuse(
            "unauth_large",
            "wrong_key_over_limit",
            "POST",
            target,
            (JSON, ("X-API-Key", secrets.token_hex(16))),
            bodies.over,
            auth="",
        )
    return Abuse(
        "unauth_large",
        "declared_terabyte",
        "POST",
        target,
        (JSON, ("Content-Length", str(10**12))),
        bodies.over,
        auth="",
        send_limit=1024 * 1024,
    )


# ---- keys, paths, methods, heads -------------------------------------------------------------


def wrong_key(ctx: Context, rng: random.Random, keys: dict[str, str]) -> Abuse:
    targets = [
        ("GET", "/conversations/hx-key/context", None),
        ("POST", "/conversations/hx-key/messages", round_body([message('"x"')])),
        ("GET", "/conversations", None),
        ("GET", "/ops/runner", None),
        ("GET", "/openapi.json", None),
        ("DELETE", "/conversations/hx-key", None),
    ]
    method, target, body = rng.choice(targets)
    variants: dict[str, tuple[tuple[str, str], ...]] = {
        "none": (),
        "bearer_empty": (("Authorization", "Bearer"),),
        "bearer_spaces": (("Authorization", "Bearer    "),),
        "bearer_random": (("Authorization", "Bearer " + secrets.token_hex(16)),),
        "basic": (("Authorization", "Basic dXNlcjpwYXNzd29yZA=="),),
        "x_api_key_short": (("X-API-Key", "short"),),
        "x_api_key_random": (("X-API-Key", secrets.token_urlsafe(48)),),
        "x_api_key_padded": (("X-API-Key", keys["a"] + " x"),),
        "x_api_key_prefix": (("X-API-Key", keys["a"][:-1]),),
        "bearer_8k": (("Authorization", "Bearer " + "k" * 8192),),
        "wrong_x_key_valid_bearer": (
            ("X-API-Key", "wrong-key-0123456789"),
            ("Authorization", f"Bearer {keys['a']}"),
        ),
        "latin1_key": (("X-API-Key", "caf\xe9-" + secrets.token_hex(12)),),
    }
    variant, headers = rng.choice(list(variants.items()))
    if body is not None:
        headers = (*headers, JSON)
    return Abuse("wrong_key", variant, method, target, headers, body, auth="")


def junk_path(ctx: Context, rng: random.Random) -> Abuse:
    cid = rng.choice(ctx.a_conversations) if ctx.a_conversations and rng.random() < 0.3 else "hx-junk"
    paths = [
        "/",
        "/admin",
        "/.env",
        "/../../etc/passwd",
        "/conversations/%2e%2e/context",
        "/conversations/a%2Fb/context",
        "/conversations/" + "a" * 51 + "/context",
        "/conversations/%00/context",
        "/conversations/%ff%fe/context",
        f"/conversations/{cid}/context/extra",
        "/ops/memories/abc/retry",
        "/ops/memories/-1/retry",
        "/ops/memories/99999999999999999999/retry",
        "/ops/memories/0/retry",
        "/ops/memories/2147483648/retry",
        f"/conversations/{cid}/messages?after_sequence=-2",
        f"/conversations/{cid}/messages?after_sequence=1e3",
        f"/conversations/{cid}/messages?limit=abc",
        f"/conversations/{cid}/messages?limit=99999999999999999999",
        "/conversations?limit=0",
        "/conversations?after=%00",
        "/conversations?after=" + "z" * 60,
        "/conversations?include_metadata=maybe",
        "/ops/memories/stuck?older_than_seconds=nan",
        "/ops/memories/stuck?older_than_seconds=inf",
        "/ops/memories/stuck?older_than_seconds=-1",
        "/ops/memories/stuck?older_than_seconds=1e-400",
        "/ops/memories/failed?limit=1001",
        "//conversations",
        f"/conversations//{cid}/context",
        "/CONVERSATIONS",
        f"/conversations/{cid};x=1/context",
        "/" + secrets.token_urlsafe(150),
        "/%",
        "/conversations/%zz/context",
        "/conversations/\u00e9t\u00e9/context".encode().decode("latin-1"),
    ]
    target = rng.choice(paths)
    method = "POST" if "/retry" in target else "GET"
    variant = target.replace(cid, "{cid}")
    variant = variant[:60] if not variant.startswith("/") or len(variant) < 80 else "/<150 random chars>"
    # 1e-400 is 0.0: a valid age; every other path here is refused.
    return Abuse("junk_path", variant, method, target, must_refuse="1e-400" not in target)


def junk_method(ctx: Context, rng: random.Random) -> Abuse:
    cid = rng.choice(ctx.a_conversations) if ctx.a_conversations else "hx-junk"
    paths = [
        "/conversations",
        f"/conversations/{cid}",
        f"/conversations/{cid}/messages",
        f"/conversations/{cid}/context",
        "/ops/runner",
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/ops/memories/1/retry",
        "/nowhere",
    ]
    methods = ["PUT", "PATCH", "OPTIONS", "TRACE", "HEAD", "FOO", "BREW", "PROPFIND", "get", "DELETE", "POST"]
    method = rng.choice(methods)
    target = rng.choice(paths)
    if method == "DELETE" and target.startswith("/conversations/") and target.count("/") in (2, 3):
        # Never delete (or clear the messages of) a conversation the suite checks.
        target = (
            "/conversations/hx-junk-delete" + target[target.index("/", 15) :]
            if target.count("/") == 3
            else "/conversations/hx-junk-delete"
        )
    if method == "POST" and target not in ("/ops/runner", "/healthz", "/readyz", "/openapi.json", "/nowhere"):
        target = "/healthz"
    # HEAD of the OpenAPI document is a GET without the body (Starlette's own route): not refused.
    refuse = not (method == "HEAD" and target == "/openapi.json")
    return Abuse(
        "junk_method", f"{method} {target.replace(cid, '{cid}')}", method, target, must_refuse=refuse
    )


def trailing_slash(ctx: Context, rng: random.Random) -> Abuse:
    cid = rng.choice(ctx.a_conversations) if ctx.a_conversations else "hx-slash"
    method, target = rng.choice(
        [
            ("GET", "/conversations/"),
            ("GET", f"/conversations/{cid}/"),
            ("GET", f"/conversations/{cid}/context/"),
            ("GET", f"/conversations/{cid}/messages/"),
            ("POST", f"/conversations/{cid}/messages/"),
            ("POST", "/conversations/"),
            ("GET", "/ops/runner/"),
            ("GET", "/healthz/"),
            ("GET", "/openapi.json/"),
            ("GET", f"/conversations/{cid}/memories/"),
        ]
    )
    body = round_body([message('"x"')]) if method == "POST" else None
    return Abuse("trailing_slash", "slash", method, target, (JSON,) if body else (), body)


def huge_header(ctx: Context, rng: random.Random, keys: dict[str, str], host: str) -> Abuse:
    cid = rng.choice(ctx.a_conversations) if ctx.a_conversations else "hx-head"
    get = f"/conversations/{cid}/context"
    auth = f"X-API-Key: {keys['a']}\r\n"

    def head(lines: str, target: str = get, method: str = "GET", version: str = "HTTP/1.1") -> bytes:
        return f"{method} {target} {version}\r\nHost: {host}\r\n{auth}{lines}\r\n".encode("latin-1")

    variants: dict[str, tuple[bytes, bool]] = {
        "one_17k_header": (head("X-Big: " + "a" * 17_000 + "\r\n"), True),
        "300_headers_18k": (head("".join(f"X-H{i}: {'v' * 50}\r\n" for i in range(300))), True),
        "target_17k": (head("", target=get + "?pad=" + "p" * 17_000), True),
        "one_15k_header": (head("X-Big: " + "a" * 15_000 + "\r\n"), False),
        "1000_tiny_headers": (head("".join(f"a{i}: b\r\n" for i in range(1000))), False),
        "request_id_10k": (head("X-Request-ID: " + "r" * 10_000 + "\r\n"), False),
        "two_content_lengths": (
            head("Content-Length: 5\r\nContent-Length: 6\r\n", method="POST") + b"hello!",
            True,
        ),
        "cl_and_te": (
            head("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", method="POST") + b"0\r\n\r\n",
            True,
        ),
        "negative_cl": (head("Content-Length: -1\r\n", method="POST"), True),
        "space_in_name": (head("Bad Header: x\r\n"), True),
        "nul_in_value": (head("X-Nul: a\x00b\r\n"), True),
        "obs_fold": (head("X-Fold: a\r\n  folded\r\n"), True),
        "http_2_0": (head("", version="HTTP/2.0"), False),
        "http_1_0": (head("", version="HTTP/1.0"), False),
        "http_0_9": (f"GET {get}\r\n\r\n".encode(), True),
        "bare_lf": (f"GET {get} HTTP/1.1\nHost: {host}\n{auth.strip()}\n\n".encode(), False),
        "no_host": (f"GET {get} HTTP/1.1\r\n{auth}\r\n".encode(), False),
        "absolute_form": (head("", target=f"http://evil.example{get}"), False),
        "asterisk_options": (head("", target="*", method="OPTIONS"), True),
        "connect": (head("", target="evil.example:443", method="CONNECT"), True),
        "upgrade_websocket": (
            head(
                "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            ),
            False,
        ),
        "upgrade_h2c": (
            head(
                "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
            ),
            False,
        ),
        "expect_100": (
            head(
                "Expect: 100-continue\r\nContent-Type: application/json\r\nContent-Length: 2\r\n",
                target=f"/conversations/{cid}/messages",
                method="POST",
            )
            + b"{}",
            True,
        ),
    }
    variant, (raw, refuse) = rng.choice(list(variants.items()))
    method = raw.split(b" ", 1)[0].decode("latin-1")
    target = raw.split(b" ", 2)[1].decode("latin-1") if raw.count(b" ") >= 2 else get
    return Abuse(
        "huge_header",
        variant,
        method,
        target.split("\r\n")[0].split("\n")[0],
        auth="",
        must_refuse=refuse,
        raw_head=raw,
    )


def cross_tenant(ctx: Context, rng: random.Random) -> Abuse:
    """Tenant C (and B) on tenant A's conversations and memories: a 404, or for the context the
    empty context of a conversation never written to (which must show nothing of A's)."""
    auth = rng.choice(["b", "c"])
    if not ctx.a_conversations:
        return Abuse(
            "cross_tenant",
            "no_target_yet",
            "GET",
            "/conversations/hx-none/context",
            auth=auth,
            empty_context_ok=True,
        )
    cid = rng.choice(ctx.a_conversations)
    pick = rng.randrange(8)
    if pick == 0:
        return Abuse(
            "cross_tenant",
            "get_context",
            "GET",
            f"/conversations/{cid}/context",
            auth=auth,
            empty_context_ok=True,
        )
    if pick == 1:
        return Abuse("cross_tenant", "get_messages", "GET", f"/conversations/{cid}/messages", auth=auth)
    if pick == 2:
        return Abuse("cross_tenant", "delete", "DELETE", f"/conversations/{cid}", auth=auth)
    if pick == 3:
        return Abuse(
            "cross_tenant",
            "post_round",
            "POST",
            f"/conversations/{cid}/messages",
            (JSON,),
            round_body([message(f'"{token()}"')]),
            auth=auth,
        )
    if pick == 4:
        return Abuse(
            "cross_tenant", "memory_chain", "GET", f"/ops/conversations/{cid}/memory-chain", auth=auth
        )
    if pick == 5:
        return Abuse("cross_tenant", "summarize", "POST", f"/ops/conversations/{cid}/summarize", auth=auth)
    if pick == 6 and ctx.a_memories:
        return Abuse(
            "cross_tenant",
            "retry_memory",
            "POST",
            f"/ops/memories/{rng.choice(ctx.a_memories)}/retry",
            auth=auth,
        )
    return Abuse(
        "cross_tenant",
        "create_same_id",
        "POST",
        "/conversations",
        (JSON,),
        f'{{"conversation_id": "{cid}"}}'.encode(),
        auth=auth,
    )


def empty_context(body: bytes) -> bool:
    """A context body that shows nothing: no summary, no message, no sequence."""
    try:
        context = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(context, dict)
        and context.get("summaries") == []
        and context.get("messages") == []
        and context.get("last_sequence") is None
    )


def poison_round(n: int) -> bytes:
    """A round of the conversation whose summaries always fail (the LLM answers 500 to it)."""
    return round_body(
        [
            message(f'"{token()} {POISON_MARKER} question {n}. Please remember this."'),
            message(f'"{token()} {POISON_MARKER} answer {n}. Noted."', role="assistant"),
        ]
    )


def normal_round(n: int, rng: random.Random) -> tuple[bytes, list[str]]:
    """A well-behaved round (text and JSON content, labels) and the tokens it carries."""
    t1, t2 = token(), token()
    user = message(f'"{t1} Question {n}: what about topic {rng.randrange(1000)}? Tell me more."')
    if rng.random() < 0.5:
        assistant = message(f'"{t2} Answer {n}. Topic explained in two sentences. Done."', role="assistant")
    else:
        assistant = message(
            f'{{"answer": "{t2} Answer {n}.", "confidence": 0.5, "sources": [1, 2, {{"k": null}}]}}',
            role="assistant",
            metadata='{"model": "fake", "latency_ms": 12}',
        )
    meta = f'{{"client": "hostile", "round": {n}}}' if rng.random() < 0.3 else None
    return round_body([user, assistant], metadata=meta), [t1, t2]


def metadata_round(step: int, keys_per_post: int = 64, value_chars: int = 8) -> bytes:
    """A round whose metadata adds ``keys_per_post`` new keys to the conversation's."""
    meta = "{" + ",".join(f'"s{step}k{i}": "{"v" * value_chars}"' for i in range(keys_per_post)) + "}"
    return round_body([message(f'"{token()} metadata step {step}"')], metadata=meta)


def fat_round(chars: int, count: int) -> bytes:
    """A valid round close to the body limit: ``count`` messages of ``chars`` characters."""
    return round_body(
        [
            message(
                '"' + token() + " " + "lorem ipsum dolor sit amet " * (chars // 27) + '"',
                role="user" if i % 2 == 0 else "assistant",
            )
            for i in range(count)
        ]
    )


Generator = Callable[[Context, random.Random], Abuse]
