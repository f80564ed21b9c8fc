"""Chat templates: the model's jinja `tokenizer.chat_template`, rendered as Hugging Face does.

Follows `apply_chat_template`'s environment: sandboxed, `trim_blocks`/`lstrip_blocks`, the
`loopcontrols` extension, `raise_exception`, `strftime_now` and a `tojson` without HTML escaping.
`worker.tokenizer.Tokenizer.render_chat` is the caller; this module knows nothing of tokens.

`GEMMA_TEMPLATE` is our own template for Gemma's turn format, used when a Gemma-style vocabulary
(`<start_of_turn>`/`<end_of_turn>`) comes in a file without `tokenizer.chat_template`, as the
Gemma 3 270M GGUF does.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

# Gemma's chat format (Gemma 3 model card / ai.google.dev "formatting" page): BOS, then per turn
# "<start_of_turn>{user|model}\n{content}<end_of_turn>\n"; a system message has no turn of its
# own but goes before the first user message followed by a blank line; turns alternate user/model,
# user first; contents are trimmed; the generation prompt opens a model turn.
GEMMA_TEMPLATE = r"""{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set prefix = messages[0]['content'] ~ '\n\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set prefix = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for m in turns -%}
    {%- if m['role'] != ('user' if loop.index0 % 2 == 0 else 'assistant') -%}
        {{- raise_exception('Gemma chats alternate user and assistant messages, user first (after an optional '
            ~ 'system message); message ' ~ (messages | length - turns | length + loop.index0) ~ ' has role '
            ~ m['role']) -}}
    {%- endif -%}
    {{- '<start_of_turn>' ~ ('model' if m['role'] == 'assistant' else 'user') ~ '\n' -}}
    {{- (prefix if loop.first else '') ~ (m['content'] | trim) ~ '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Like HF's override of jinja's tojson: no HTML escaping, keeps non-ASCII.
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    """The compiled template; jinja2.TemplateSyntaxError when the source is not valid jinja."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render(
    template: jinja2.Template,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool,
    extra: Mapping[str, Any],
) -> str:
    """The template's text for `messages`; ValueError when the template fails (raise_exception included)."""
    variables: dict[str, Any] = {
        "bos_token": bos_token,
        "eos_token": eos_token,
        **extra,
        "messages": [dict(m) for m in messages],
        "add_generation_prompt": add_generation_prompt,
    }
    try:
        return str(template.render(**variables))
    except jinja2.TemplateError as exc:
        raise ValueError(f"chat template failed: {exc}") from exc
