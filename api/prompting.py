"""Prompts for the base model, without torch: chat templates (jinja2) and token counting (`tokenizers`).

`BaseModelTokenizer.load(model_dir)` reads, once per process:
  tokenizer.json                       the fast tokenizer (token counts, prompt token ids)
  tokenizer_config.json                special tokens (bos/eos/...) and, in older layouts, `chat_template`
  chat_template.jinja / .json          the chat template in newer transformers layouts
  config.json                          `max_position_embeddings` = the context length

Chat rendering follows `transformers.PreTrainedTokenizerBase.apply_chat_template`: a sandboxed jinja2
environment with trim_blocks/lstrip_blocks and loopcontrols, the `raise_exception`, `strftime_now` and
(non-HTML-escaping) `tojson` helpers, variables `messages`, `add_generation_prompt=True` and the special
tokens (`bos_token`, `eos_token`, ...). The rendered text already holds the template's special tokens, so it
is tokenized WITHOUT adding special tokens again (as transformers does); a plain completion prompt is
tokenized WITH them (the tokenizer's post-processor, e.g. a Llama BOS).

A tokenizer without a chat template gets DEFAULT_CHAT_TEMPLATE (ChatML-style, documented below).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

# Used when the base model's tokenizer has no chat template: one ChatML block per message, then the
# assistant header when a reply is wanted. Example for [{"role": "user", "content": "hi"}]:
#   "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class PromptError(ValueError):
    """A prompt that cannot be rendered or tokenized; the message says what to change."""


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template the way transformers does (sandboxed; same helpers and whitespace rules)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _token_text(value: Any) -> str | None:
    """Special tokens are strings or, in older configs, AddedToken dicts with `content`."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value: Any) -> str | None:
    """A template string, or the `default` one of a list of named templates."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


def read_chat_template(model_dir: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The model's chat template: chat_template.jinja, chat_template.json, then tokenizer_config.json."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    json_file = model_dir / "chat_template.json"
    if json_file.is_file():
        template = _pick_template(json.loads(json_file.read_text()).get("chat_template"))
        if template:
            return template
    return _pick_template(tokenizer_config.get("chat_template"))


def message_text(content: Any, index: int) -> str:
    """A message's content as text: a string, or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise PromptError(f"messages[{index}].content: only text parts are supported, got {kind!r}")
            texts.append(part["text"])
        return "".join(texts)
    raise PromptError(f"messages[{index}].content must be a string or a list of text parts")


TOOL_MESSAGE_FIELDS = ("tool_calls", "tool_call_id", "name")  # kept for templates that render tool calls


def normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """{"role", "content"} dicts for the template (plus an assistant's `tool_calls`, a tool result's
    `tool_call_id` and `name` when sent); 400-worthy PromptError on anything else."""
    if not messages:
        raise PromptError("messages must hold at least one message")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise PromptError(f"messages[{i}] must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise PromptError(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        normalized: dict[str, Any] = {"role": role, "content": message_text(message.get("content"), i)}
        out.append(normalized | {k: message[k] for k in TOOL_MESSAGE_FIELDS if message.get(k) is not None})
    return out


@dataclass(frozen=True)
class BaseModelTokenizer:
    """The base model's tokenizer, chat template, special tokens and context length (no torch)."""

    tokenizer: Tokenizer
    chat_template: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    max_context_tokens: int | None = None
    has_own_chat_template: bool = True

    @classmethod
    def load(cls, model_dir: Path) -> BaseModelTokenizer:
        """Read tokenizer.json, tokenizer_config.json, the chat template and config.json from model_dir."""
        model_dir = Path(model_dir)
        config = _read_json(model_dir / "tokenizer_config.json")
        template = read_chat_template(model_dir, config)
        specials = {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name)))}
        context = _read_json(model_dir / "config.json").get("max_position_embeddings")
        return cls(
            tokenizer=Tokenizer.from_file(str(model_dir / "tokenizer.json")),
            chat_template=template or DEFAULT_CHAT_TEMPLATE,
            special_tokens=specials,
            max_context_tokens=int(context) if context else None,
            has_own_chat_template=template is not None,
        )

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text (add_special_tokens applies the tokenizer's post-processor, e.g. BOS)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def render_chat(self, messages: Sequence[Any], tools: list[dict[str, Any]] | None = None) -> str:
        """The chat prompt: the template over the messages (and `tools`, when given) with add_generation_prompt."""
        normalized = normalize_messages(messages)
        extra = {"tools": tools} if tools else {}
        try:
            return compile_chat_template(self.chat_template).render(
                messages=normalized, add_generation_prompt=True, **extra, **self.special_tokens
            )
        except jinja2.exceptions.TemplateError as exc:
            raise PromptError(f"the model's chat template refused these messages: {exc}") from exc

    def encode_chat(
        self, messages: Sequence[Any], tools: list[dict[str, Any]] | None = None
    ) -> tuple[str, list[int]]:
        """Rendered chat prompt and its token ids (the template already placed the special tokens)."""
        text = self.render_chat(messages, tools)
        return text, self.encode(text, add_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        """Token ids are 0 <= id < vocab_size (added tokens included)."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of token ids (special tokens dropped), as completions' `echo` shows a token prompt."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        """One token's text as logprobs show it (special tokens included)."""
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))

    def check_token_ids(self, token_ids: Sequence[Any]) -> list[int]:
        """Validate a pre-tokenized prompt against the vocabulary."""
        vocab_size = self.vocab_size
        for i, token in enumerate(token_ids):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
                raise PromptError(f"prompt[{i}] is not a token id of this model (0 <= id < {vocab_size})")
        return list(token_ids)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def load_base_tokenizer(model_dir: Path | None) -> BaseModelTokenizer | None:
    """The tokenizer of the base model at model_dir, or None when there is no model (yet) or no tokenizer.json."""
    if model_dir is None or not (Path(model_dir) / "tokenizer.json").is_file():
        return None
    return BaseModelTokenizer.load(Path(model_dir))
