"""vLLM's OpenAI-compatible wire format: reading a completion request, refusing one that does not
fit, and writing the answer whole or as server-sent events.

The server (`simulator.server`) owns the engines; this module only turns bodies into what the
engines need and engine outputs into the bodies vLLM 0.32 sends.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from stallwatch.simulator.engine import TokenEvent

VLLM_VERSION = "0.32.0"
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
WORDS = ("the", "model", "server", "token", "slot", "queue", "batch", "step", "cache", "prompt")

# The simulator's words (`w3`..`w1023`, or any word) count one token each; vLLM rejects a prompt
# by its characters first, assuming at most this many characters per token.
MAX_CHARS_PER_TOKEN = 5


class RequestFailed(Exception):
    """The engine failed a request in flight; carries vLLM's HTTP status and error type."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message


def error_response(
    message: str, error_type: str, status: int, param: str | None = None
) -> web.Response:
    """vLLM's `ErrorResponse` body: `{"error": {"message", "type", "param", "code"}}`."""
    body = {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    return web.json_response(body, status=status)


def context_overflow(
    max_model_len: int, max_tokens: int, prompt_tokens: int, *, prompt_chars: int
) -> tuple[str, str] | None:
    """vLLM's (0.30 and later) refusal of a request longer than the context, or None.

    It checks the prompt's characters before tokenizing, then tokenizes at most enough of the
    prompt to know it is too long, so its message gives a lower bound, not the prompt's size.
    """
    room = max_model_len - max_tokens
    head = (
        f"This model's maximum context length is {max_model_len} tokens. "
        f"However, you requested {max_tokens} output tokens and your prompt contains "
    )
    tail = "Please reduce the length of the input prompt or the number of requested output tokens."
    upper_chars = max(room, 0) * MAX_CHARS_PER_TOKEN
    if prompt_chars > upper_chars and prompt_tokens + max_tokens > max_model_len:
        return (
            f"{head}{prompt_chars} characters (more than {upper_chars} characters, which is the "
            f"upper bound for {max(room, 0)} input tokens). {tail} "
            f"(parameter=input_text, value={prompt_chars})",
            "input_text",
        )
    if prompt_tokens + max_tokens > max_model_len:
        at_least = max(room, 0) + 1
        return (
            f"{head}at least {at_least} input tokens, for a total of at least "
            f"{at_least + max_tokens} tokens. {tail} (parameter=input_tokens, value={at_least})",
            "input_tokens",
        )
    return None


def count_prompt_tokens(text: str) -> int:
    """The simulator's tokenizer: one token per whitespace-separated word (at least one)."""
    return max(1, len(text.split()))


@dataclass(frozen=True)
class Generation:
    """What a valid completion or chat completion request asks of the engine."""

    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


def parse_generation(
    body: dict[str, Any], chat: bool, *, model: str, max_model_len: int
) -> Generation | web.Response:
    """The request's generation, or the error response vLLM gives for it."""
    requested_model = body.get("model", model)
    if requested_model != model:
        return error_response(
            f"The model `{requested_model}` does not exist.", "NotFoundError", 404, "model"
        )
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error_response(
                "messages must be a non-empty list", "BadRequestError", 400, "messages"
            )
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            prompt = " ".join(prompt)
        if not isinstance(prompt, str):
            return error_response("prompt must be a string", "BadRequestError", 400, "prompt")
        text = prompt
    prompt_tokens = count_prompt_tokens(text)
    default_max = 16 if not chat else max_model_len - prompt_tokens
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_max))
    if max_tokens is None:
        max_tokens = default_max
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return error_response(
            f"max_tokens must be at least 1, got {max_tokens}.",
            "BadRequestError",
            400,
            "max_tokens",
        )
    overflow = context_overflow(max_model_len, max_tokens, prompt_tokens, prompt_chars=len(text))
    if overflow is not None:
        message, param = overflow
        return error_response(message, "BadRequestError", 400, param)
    stream_options = body.get("stream_options")
    return Generation(
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stream=bool(body.get("stream", False)),
        include_usage=isinstance(stream_options, dict)
        and bool(stream_options.get("include_usage")),
    )


def model_list(
    model: str, max_model_len: int, created: int, owned_by: str = "vllm"
) -> dict[str, Any]:
    """The `/v1/models` body: one model card, as vLLM lists the model it serves (`owned_by`
    says which engine's face answers; every engine's card carries one)."""
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": owned_by,
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return {"object": "list", "data": [card]}


@dataclass(frozen=True)
class ResponseMeta:
    """The fields every body of one answer repeats: its id, time, model and kind."""

    request_id: str
    created: int
    model: str
    chat: bool
    prompt_tokens: int

    def usage(self, generated: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + generated,
            "completion_tokens": generated,
            "prompt_tokens_details": None,
        }

    def full_response(self, text: str, finish_reason: str, generated: int) -> dict[str, Any]:
        choice: dict[str, Any]
        if self.chat:
            choice = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        return {
            "id": self.request_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self.usage(generated),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }

    def chunk(self, content: str | dict[str, str], finish_reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any]
        if self.chat:
            delta = content if isinstance(content, dict) else {"content": content}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {
                "index": 0,
                "text": content,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def usage_chunk(self, generated: int) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(generated),
        }


async def respond_whole(
    meta: ResponseMeta, events: AsyncIterator[TokenEvent], words: Callable[[int], str]
) -> web.Response:
    """One JSON body once the request finishes, or vLLM's error if the engine failed it."""
    generated = 0
    finish_reason = "length"
    try:
        async for event in events:
            generated += event.new_tokens
            if event.finish_reason is not None:
                finish_reason = event.finish_reason
    except RequestFailed as failure:
        return error_response(failure.message, failure.error_type, failure.status)
    text = words(generated)
    return web.json_response(meta.full_response(text, finish_reason, generated))


async def respond_stream(
    request: web.Request,
    meta: ResponseMeta,
    events: AsyncIterator[TokenEvent],
    words: Callable[[int], str],
    include_usage: bool,
) -> web.StreamResponse:
    """Server-sent events: a chunk per engine output, an error event on failure, `[DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)

    async def send(payload: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(payload)}\n\n".encode())

    generated = 0
    if meta.chat:
        await send(meta.chunk({"role": "assistant", "content": ""}, None))
    try:
        async for event in events:
            generated += event.new_tokens
            await send(meta.chunk(words(event.new_tokens), event.finish_reason))
    except RequestFailed as failure:
        error = {
            "message": failure.message,
            "type": failure.error_type,
            "param": None,
            "code": failure.status,
        }
        await send({"error": error})
    else:
        if include_usage:
            await send(meta.usage_chunk(generated))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
