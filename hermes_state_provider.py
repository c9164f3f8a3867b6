"""Provider wire format: which reasoning fields each chat-completions route reads.

Owns: `to_provider_messages` (stored conversation -> request messages), the per-route
reasoning carriers (`reasoning_carriers`), the strict OpenAI route (`is_openai_route`: only
the keys the Chat Completions schema declares for each role), and `ReasoningFieldMemory`,
the per-session record of fields a route rejected by name, and `strip_echoed_user_input` (a
server's echo of the input just sent, dropped from its reply items) and `sanitize_context` (recalled
memory's fences taken out of text).
Does not own: reading or writing rows (hermes_state_conversation builds the conversation).

Transaction contract: none. Pure functions over dicts; the input conversation (the history)
is never modified, every output dict is a new one. Imports nothing of ours.
"""
from __future__ import annotations

import ipaddress
import json
import re
from typing import Any, Iterable, Sequence
from urllib.parse import urlparse

REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_details")
# Stored beside a turn but never sent on a chat-completions wire.
# Stored facts about a message that are not part of a request: when, why it stopped, whether
# the agent only observed it, the platform's id, what its side effect became.
_NON_WIRE = frozenset({"message_uid", "codex_reasoning_items", "codex_message_items", *REASONING_FIELDS,
                       "timestamp", "finish_reason", "observed", "message_id", "effect_disposition"})

_DEFAULT = ("reasoning_content",)
_GATEWAY = ("reasoning_content", "reasoning", "reasoning_details")
_DETAILS = ("reasoning_content", "reasoning_details")
_LOCAL = ("reasoning_content", "reasoning")
_STRICT: tuple[str, ...] = ()

# Provider names (normalised: lower case, "_"/" " as "-") -> carriers.
_BY_NAME: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("openrouter", "kilo", "kilocode", "kilo-code", "vercel", "vercel-ai-gateway", "ai-gateway",
                     "nous", "nous-portal", "nousresearch"), _GATEWAY),
    **dict.fromkeys(("novita", "tokenhub"), _DETAILS),
    **dict.fromkeys(("local", "ollama", "upstage", "lmstudio", "lm-studio", "llamacpp", "llama.cpp", "llama-cpp",
                     "vllm", "sglang"), _LOCAL),
    **dict.fromkeys(("mistral", "groq", "cerebras", "sambanova"), _STRICT),
    **dict.fromkeys(("fireworks", "fireworks-ai"), _DEFAULT),
}
# Host suffixes -> carriers, for a custom provider name pointed at a known endpoint.
_BY_HOST: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("openrouter.ai", _GATEWAY), ("kilocode.ai", _GATEWAY), ("kilo.ai", _GATEWAY),
    ("ai-gateway.vercel.sh", _GATEWAY), ("nousresearch.com", _GATEWAY),
    ("novita.ai", _DETAILS), ("tokenhub.ai", _DETAILS),
    ("upstage.ai", _LOCAL),
    ("mistral.ai", _STRICT), ("groq.com", _STRICT), ("cerebras.ai", _STRICT), ("sambanova.ai", _STRICT),
    ("fireworks.ai", _DEFAULT),
)
_MINIMAX_NAMES = frozenset({"minimax", "minimaxi"})
_MINIMAX_HOSTS = ("minimax.io", "minimaxi.com", "minimax.chat")
# Their APIs reject a tool-call turn without reasoning while thinking is on, so it is padded.
_PAD_NAMES = frozenset({"deepseek", "kimi", "kimi-coding", "moonshot", "moonshotai", "mimo", "xiaomi",
                        "xiaomi-mimo"})
_PAD_HOSTS = ("deepseek.com", "moonshot.ai", "moonshot.cn", "kimi.com", "xiaomimimo.com")


def _name(provider: str | None) -> str:
    return re.sub(r"[\s_]+", "-", (provider or "").strip().lower())


def _host(base_url: str | None) -> tuple[str, int | None, str]:
    if not base_url:
        return "", None, ""
    parsed = urlparse(base_url if "://" in base_url else "http://" + base_url)
    try:
        port = parsed.port
    except ValueError:
        port = None
    return (parsed.hostname or "").lower(), port, parsed.path.rstrip("/")


def _on(host: str, suffixes: Iterable[str]) -> bool:
    return any(host == s or host.endswith("." + s) for s in suffixes)


def _is_local(host: str, port: int | None) -> bool:
    if host in ("localhost", "host.docker.internal") or host.endswith((".local", ".localhost", ".internal")):
        return True
    if port == 11434 or "ollama" in host:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_unspecified or ip.is_link_local


def reasoning_carriers(provider: str | None = None, base_url: str | None = None) -> tuple[str, ...]:
    """Return the fields that carry stored reasoning on this route (empty for strict schemas).

    The provider name decides when it is known; otherwise the base URL's host does. The
    default is `reasoning_content` alone.
    """
    if is_openai_route(provider, base_url):
        return _STRICT
    name = _name(provider)
    host, port, path = _host(base_url)
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name in _MINIMAX_NAMES or (name not in _PAD_NAMES and _on(host, _MINIMAX_HOSTS)):
        # Only MiniMax's OpenAI-style /v1 endpoint reads reasoning_details.
        return _DETAILS if not path or path.endswith("/v1") else _DEFAULT
    if name in _PAD_NAMES:
        return _DEFAULT
    for suffix, carriers in _BY_HOST:
        if _on(host, (suffix,)):
            return carriers
    if host and _is_local(host, port):
        return _LOCAL
    return _DEFAULT


def pads_tool_call_turns(provider: str | None = None, base_url: str | None = None) -> bool:
    """Tell whether the route needs `reasoning_content=" "` on a tool-call turn without reasoning."""
    return _name(provider) in _PAD_NAMES or _on(_host(base_url)[0], _PAD_HOSTS)


# --- the strict OpenAI route --------------------------------------------------------------------
# api.openai.com rejects any key its schema does not declare ("Unrecognized request argument"),
# so this route builds each message from the declared keys of its role instead of stripping
# the ones known to be foreign. The keys are those of the openai SDK's *MessageParam types.
_OPENAI_HOSTS = ("api.openai.com",)
_OPENAI_KEYS: dict[str, tuple[str, ...]] = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "name", "refusal", "tool_calls", "audio", "function_call"),
    "tool": ("role", "content", "tool_call_id"),
    "function": ("role", "content", "name"),
}
# Content part types each role accepts; user parts are open-ended (text, image_url, input_audio, file).
_OPENAI_PART_TYPES: dict[str, frozenset[str] | None] = {
    "user": None, "assistant": frozenset({"text", "refusal"}), "system": frozenset({"text"}),
    "developer": frozenset({"text"}), "tool": frozenset({"text"}), "function": frozenset({"text"}),
}
_OPENAI_CALL_KEYS = {"function": ("name", "arguments"), "custom": ("name", "input")}


def is_openai_route(provider: str | None = None, base_url: str | None = None) -> bool:
    """Tell whether the request goes to OpenAI's own Chat Completions API (the strict route).

    The host decides when there is one (provider "openai" pointed at a local or other
    OpenAI-compatible server keeps that server's route); without a base URL the name does.
    """
    host = _host(base_url)[0]
    return _on(host, _OPENAI_HOSTS) if host else _name(provider) == "openai"


def _openai_part(part: Any) -> Any:
    # A part keeps its type and the field named after it ({"type": "image_url", "image_url": {...}}).
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        return part
    return {k: part[k] for k in ("type", part["type"]) if k in part}


def _openai_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    kind = call.get("type") or "function"
    out: dict[str, Any] = {"id": call.get("id"), "type": kind}
    body = call.get(kind)
    if isinstance(body, dict):
        body = {k: body[k] for k in _OPENAI_CALL_KEYS.get(kind, ()) if k in body}
        if kind == "function" and not isinstance(body.get("arguments", ""), str):
            body["arguments"] = json.dumps(body["arguments"], ensure_ascii=False)  # the wire wants JSON text
    out[kind] = body
    return out


def _openai_parts(role: str, content: list[Any]) -> list[Any]:
    # The content parts the role may carry on this route (every part when it names no types).
    allowed = _OPENAI_PART_TYPES[role]
    return [_openai_part(p) for p in content if allowed is None or (isinstance(p, dict) and p.get("type") in allowed)]


def _openai_message(index: int, msg: dict[str, Any]) -> dict[str, Any]:
    role = msg.get("role")
    if role not in _OPENAI_KEYS:
        raise ValueError(f"message {index}: role {role!r} is not a Chat Completions role")
    out = {k: msg[k] for k in _OPENAI_KEYS[role] if msg.get(k) is not None}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = _openai_parts(role, content)
    elif content is not None and not isinstance(content, str):
        raise ValueError(f"message {index}: its content is a {type(content).__name__}, which Chat Completions "
                         "does not take (text or a list of content parts)")
    elif content is None and (role != "assistant" or not out.get("tool_calls")):
        out["content"] = ""  # only an assistant turn that calls tools may omit its content
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_openai_call(c) for c in out["tool_calls"]]
    return out


def to_provider_messages(conversation: Iterable[dict[str, Any]], provider: str | None = None,
                         base_url: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
    """Return request messages: non-wire keys stripped, stored reasoning routed to the route's fields.

    Strips `message_uid`, every `_`-prefixed runtime key and the codex item lists; an
    assistant turn's reasoning goes to the fields `reasoning_carriers` names. `model` is
    accepted for symmetry with ReasoningFieldMemory; routing is by provider and host.
    On the strict OpenAI route (`is_openai_route`) each message holds only the keys the
    Chat Completions schema declares for its role (no reasoning, no `name` on tool results);
    a role that schema does not know, or content that is neither text nor a list of parts (a
    provider's wrapper object stored whole), raises ValueError.
    """
    if is_openai_route(provider, base_url):
        return [_openai_message(i, msg) for i, msg in enumerate(conversation)]
    carriers = reasoning_carriers(provider, base_url)
    pad = pads_tool_call_turns(provider, base_url)
    out = []
    for msg in conversation:
        wire = {k: v for k, v in msg.items() if k not in _NON_WIRE and not k.startswith("_")}
        if msg.get("role") == "assistant":
            text = msg.get("reasoning_content")
            raw = msg.get("reasoning")
            stored = {"reasoning_content": text if text is not None else raw,
                      "reasoning": raw if raw is not None else text,
                      "reasoning_details": msg.get("reasoning_details")}
            for field in carriers:
                if stored[field] is not None:
                    wire[field] = stored[field]
            if pad and msg.get("tool_calls") and not wire.get("reasoning_content"):
                wire["reasoning_content"] = " "
        out.append(wire)
    return out


_REJECTED_FIELD = re.compile(r"messages(?:\[\d+\]|\.\d+)\.([A-Za-z_]+)")
_REJECTION_WORDS = ("not permitted", "extra", "unrecognized", "unrecognised", "unknown", "not allowed",
                    "unexpected", "additional properties")


class ReasoningFieldMemory:
    """Reasoning fields each (provider, host, model) rejected, for the life of one session.

    On a rejection such as "Extra inputs are not permitted, field: messages[3].reasoning_details"
    call `record()`; when it returns the field, retry once with `filter()` applied. A second
    rejection of the same field returns None: do not retry again. History is never modified.
    """

    def __init__(self) -> None:
        self._rejected: dict[tuple[str, str, str], set[str]] = {}

    @staticmethod
    def _key(provider: str | None, base_url: str | None, model: str | None) -> tuple[str, str, str]:
        return _name(provider), _host(base_url)[0], (model or "").strip().lower()

    def record(self, error: BaseException | str, *, provider: str | None = None, base_url: str | None = None,
               model: str | None = None) -> str | None:
        """Remember the reasoning field a route rejected; return it if this is news (retry once)."""
        text = str(error)
        if not any(word in text.lower() for word in _REJECTION_WORDS):
            return None
        fields = [f for f in _REJECTED_FIELD.findall(text) if f in REASONING_FIELDS]
        if not fields:
            return None
        known = self._rejected.setdefault(self._key(provider, base_url, model), set())
        if fields[0] in known:
            return None
        known.add(fields[0])
        return fields[0]

    def rejected(self, provider: str | None = None, base_url: str | None = None,
                 model: str | None = None) -> frozenset[str]:
        """Return the fields this route has rejected so far."""
        return frozenset(self._rejected.get(self._key(provider, base_url, model), ()))

    def filter(self, messages: Iterable[dict[str, Any]], *, provider: str | None = None,
               base_url: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """Return copies of request messages without the fields this route rejected."""
        drop = self.rejected(provider, base_url, model)
        return [{k: v for k, v in m.items() if k not in drop} for m in messages]


# --- echoed user input ------------------------------------------------------------------------------

def render_user_input(content: Any) -> str:
    """Render user input (a str or a list of rich input parts) as one text, parts joined by newlines.

    Text parts give their text; images give `[image: <url or path>]`; any other part gives
    `[<type>: <name or path>]`. Both sides of an echo comparison are rendered this way.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, (list, tuple)):
        return "" if content is None else str(content)
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
        elif not isinstance(part, dict):
            out.append(str(part))
        elif isinstance(part.get("text"), str):
            out.append(part["text"])
        elif part.get("type") in ("image", "localImage", "input_image"):
            out.append(f"[image: {part.get('url') or part.get('path') or part.get('image_url') or ''}]")
        else:
            out.append(f"[{part.get('type', 'input')}: {part.get('name') or part.get('path') or ''}]")
    return "\n".join(out)


def strip_echoed_user_input(items: Sequence[dict[str, Any]], sent_texts: Any) -> list[dict[str, Any]]:
    """Return `items` without the server's echo of the input just sent, if the first user item is that echo.

    Only the first `userMessage` item is considered, and it is dropped only when its rendered
    content equals the rendered `sent_texts` (what turn/start sent: a str or a list of parts).
    Later user items, a first one that differs, and a separately admitted identical turn stay.
    Pure: the input list is not modified.
    """
    out = list(items)
    sent = render_user_input(list(sent_texts) if isinstance(sent_texts, tuple) else sent_texts)
    for index, item in enumerate(out):
        if isinstance(item, dict) and item.get("type") == "userMessage":
            content = item["content"] if "content" in item else item.get("text")
            if render_user_input(content) == sent:
                del out[index]
            break
    return out


# --- recalled memory, fenced out of text that goes back into a prompt ---------------------------
# The agent wraps recalled memory in <memory-context> tags with a note saying it is background,
# not user input. Text that is stored or quoted again must not carry that fence, or the memory
# would come back as if the user had written it.
_MEMORY_BLOCK = re.compile(r"<memory-context>.*?</memory-context>", re.IGNORECASE | re.DOTALL)
_MEMORY_TAG = re.compile(r"</?memory-context>", re.IGNORECASE)
_MEMORY_NOTE = re.compile(r"\[System note: The following is recalled memory context, NOT new user input\. "
                          r"Treat as informational background data\.\]\s*", re.IGNORECASE)


def sanitize_context(text: str) -> str:
    """Return `text` without recalled-memory fences: whole <memory-context> blocks, stray tags and the memory note."""
    if not isinstance(text, str):
        raise TypeError(f"sanitize_context() takes a str, not {type(text).__name__}")
    return _MEMORY_NOTE.sub("", _MEMORY_TAG.sub("", _MEMORY_BLOCK.sub("", text)))
