"""OpenAI-compatible request parsing and response bodies, in the shapes vLLM's server produces."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from . import decoding
from .answers import Answer

DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    """An error answered as vLLM answers it: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class Generation:
    chat: bool
    model: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no logprobs requested
    prompt_logprobs: int | None = None  # vLLM's extension (completions): logprobs of every prompt token
    body: dict[str, Any] = field(default_factory=dict)  # the request as sent (answers.py reads chat options)
    prompt_ids: list[int] = field(default_factory=list)  # the token ids the prompt is read as (sent, or its text's)
    return_token_ids: bool = False  # vLLM's extension: the choice carries prompt_token_ids and token_ids
    sent_as_ids: bool = False  # the prompt came as token ids: vLLM's renderer has no text to tokenize


def _int_field(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ApiError(400, f"{name} must be an integer in [{lo}, {hi}], got {value!r}", param=name)
    return value


def _completion_prompt(prompt: Any) -> tuple[str, list[int] | None]:
    """The prompt's text, and its token ids when it was sent as ids: vLLM's CompletionRequest.prompt is
    `list[int] | list[list[int]] | str | list[str]`; the stub takes one prompt per request."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t < decoding.VOCAB_SIZE), None)
        if bad is not None:
            raise ApiError(400, f"Token id {bad} is out of vocabulary (ids are 0 to {decoding.VOCAB_SIZE - 1})",
                           param="prompt")
        return decoding.decode(prompt), list(prompt)
    raise ApiError(400, "prompt must be a string or a non-empty list of token ids (one prompt per request)",
                   param="prompt")


def _chat_prompt(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            raise ApiError(400, "each message must be an object", param="messages")
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role', 'user')}: {content}")
    return "\n".join(parts)


def parse(body: Any, *, chat: bool, served_names: list[str], max_model_len: int) -> Generation:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model") or served_names[0]
    if model not in served_names:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    prompt, sent_ids = (_chat_prompt(body.get("messages")), None) if chat else _completion_prompt(body.get("prompt"))
    prompt_ids = sent_ids if sent_ids is not None else decoding.encode(prompt)
    n_prompt = len(sent_ids) if sent_ids is not None else decoding.prompt_tokens(prompt)
    # Chat clients may send the newer max_completion_tokens instead of max_tokens.
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int_field(body, name, DEFAULT_MAX_TOKENS, 1, 2**31) or DEFAULT_MAX_TOKENS
    if n_prompt + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
        )
    if chat:
        top: int | None = None
        if body.get("logprobs"):
            top = _int_field(body, "top_logprobs", 0, 0, decoding.TOP_N)
    else:
        top = _int_field(body, "logprobs", None, 0, decoding.TOP_N)
    prompt_top = _int_field(body, "prompt_logprobs", None, 0, decoding.TOP_N)
    if prompt_top is not None and chat:
        raise ApiError(400, "the stub answers prompt_logprobs on /v1/completions only", param="prompt_logprobs")
    options = body.get("stream_options") or {}
    return Generation(
        chat=chat,
        model=model,
        prompt=prompt,
        prompt_tokens=n_prompt,
        max_tokens=max_tokens,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        top_logprobs=top,
        prompt_logprobs=prompt_top,
        body=body,
        prompt_ids=prompt_ids,
        return_token_ids=bool(body.get("return_token_ids")) and not chat,
        sent_as_ids=sent_ids is not None,
    )


def tokenize_answer(body: Any, *, served_names: list[str], max_model_len: int) -> dict[str, Any]:
    """POST /tokenize as vLLM answers it: a completion's `prompt` or a chat's `messages` in, their token
    ids out as {"count", "max_model_len", "tokens"} (and "token_strs" with `return_token_strs`)."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model") or served_names[0]
    if model not in served_names:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    if "messages" in body:
        text = _chat_prompt(body["messages"])
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        raise ApiError(400, "prompt must be a string (or send messages)", param="prompt")
    ids = decoding.encode(text)
    strs = [decoding.token_text(t) for t in ids] if body.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def detokenize_answer(body: Any) -> dict[str, Any]:
    """POST /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                               for t in tokens):
        raise ApiError(400, "tokens must be a list of non-negative token ids", param="tokens")
    return {"prompt": decoding.decode(tokens)}


class Renderer:
    """Builds the response objects of one request from the positions the engine emitted."""

    def __init__(self, gen: Generation, request_id: str, tokens: decoding.TokenStream,
                 answer: Answer | None = None) -> None:
        self.gen = gen
        self.answer = answer
        self.request_id = request_id
        self.tokens = tokens
        self.created = int(time.time())
        self._text_offset = 0

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.gen.model}

    def _completion_logprobs(self, positions: range) -> dict[str, Any]:
        k = max(1, self.gen.top_logprobs or 0)
        out: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for i in positions:
            top = self.tokens.top_logprobs(i, k)
            text = decoding.token_text(top[0][0])
            out["text_offset"].append(self._text_offset)
            out["token_logprobs"].append(top[0][1])
            out["tokens"].append(text)
            out["top_logprobs"].append({decoding.token_text(t): lp for t, lp in top})
            self._text_offset += len(text)
        return out

    def _chat_logprobs(self, positions: range) -> dict[str, Any]:
        content = []
        for i in positions:
            top = self.tokens.top_logprobs(i, max(1, self.gen.top_logprobs or 0))
            text = decoding.token_text(top[0][0])
            alts = top[: self.gen.top_logprobs or 0]
            content.append(
                {
                    "token": text,
                    "logprob": top[0][1],
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {"token": decoding.token_text(t), "logprob": lp, "bytes": list(decoding.token_text(t).encode())}
                        for t, lp in alts
                    ],
                }
            )
        return {"content": content}

    def _logprobs(self, positions: range) -> dict[str, Any] | None:
        if self.gen.top_logprobs is None:
            return None
        return self._chat_logprobs(positions) if self.gen.chat else self._completion_logprobs(positions)

    def _text(self, positions: range) -> str:
        return "".join(decoding.token_text(self.tokens.token(i)) for i in positions)

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.gen.prompt_tokens,
            "total_tokens": self.gen.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }

    # -- streaming ------------------------------------------------------------------------------

    def role_chunk(self) -> dict[str, Any]:
        """vLLM's first chat chunk carries only the assistant role."""
        return {
            **self._head("chat.completion.chunk"),
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ],
        }

    def token_chunk(self, index: int, finish_reason: str | None, count: int = 1) -> dict[str, Any]:
        """The chunk of one engine step: its `count` tokens from position `index` on (several under
        speculative decoding, none for an aborted request's last chunk)."""
        positions = range(index, index + count)
        choice: dict[str, Any] = {"index": 0}
        if self.gen.chat:
            choice["delta"] = {"content": self._text(positions)}
        else:
            choice["text"] = self._text(positions)
        choice["logprobs"] = self._logprobs(positions)
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = None
        obj = "chat.completion.chunk" if self.gen.chat else "text_completion"
        return {**self._head(obj), "choices": [choice]}

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.gen.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": self.usage(completion_tokens)}

    # -- non-streaming --------------------------------------------------------------------------

    def response(self, completion_tokens: int, finish_reason: str) -> dict[str, Any]:
        positions = range(completion_tokens)
        choice: dict[str, Any] = {"index": 0}
        if self.answer is not None:
            # Rendered whole: the engine decoded as many steps as the reply has tokens.
            message: dict[str, Any] = {"role": "assistant", "content": self.answer.content,
                                       "tool_calls": self.answer.tool_calls}
            if self.answer.reasoning is not None:
                message["reasoning"] = self.answer.reasoning
            choice["message"] = message
            finish_reason = self.answer.finish_reason
        elif self.gen.chat:
            choice["message"] = {"role": "assistant", "content": self._text(positions), "tool_calls": []}
        else:
            choice["text"] = self._text(positions)
        choice["logprobs"] = self._logprobs(positions)
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = None
        if self.gen.prompt_logprobs is not None:
            # As vLLM's non-streaming completion: None for the first prompt token, then one mapping per token.
            choice["prompt_logprobs"] = self.tokens.prompt_logprobs(self.gen.prompt_logprobs)
        if self.gen.return_token_ids:
            # vLLM's CompletionResponseChoice: the ids the engine read (an id prompt as sent) and generated.
            choice["prompt_token_ids"] = list(self.tokens.prompt_ids)
            choice["token_ids"] = [self.tokens.token(i) for i in positions]
        obj = "chat.completion" if self.gen.chat else "text_completion"
        return {**self._head(obj), "choices": [choice], "usage": self.usage(completion_tokens)}
