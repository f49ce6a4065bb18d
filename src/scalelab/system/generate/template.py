"""Chat templates rendered the way transformers' `apply_chat_template` renders them.

Hugging Face chat templates are Jinja programs written against one environment: a sandbox
(`ImmutableSandboxedEnvironment`, trim_blocks and lstrip_blocks on), the loop-controls
extension (`{% break %}`, `{% continue %}`), a `{% generation %}` tag, `raise_exception`,
`strftime_now`, a `tojson` that does not HTML-escape, and the tokenizer's special tokens
(`bos_token`, `eos_token`, ...) as variables. A template that uses any of these fails or renders
differently elsewhere, so this module builds the same environment; tests/system/generate/
test_template.py renders SmolLM2's and two other Llama-family templates here and through
transformers and asserts the strings are equal. transformers itself is not imported (it is a
test dependency only).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from scalelab.lab.core.errors import BadInputError


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes (<, >, &, '), which a prompt must not see.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> Any:
    """The compiled `jinja2.Template` (cached: a server renders one template per request)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` marks the assistant's tokens for training
        masks; rendering a prompt only needs its body."""

        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it so)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body
                                          ).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except TemplateSyntaxError as e:
        raise BadInputError(f"the model's chat template does not parse (line {e.lineno}): "
                            f"{e.message}") from e


def render(source: str, messages: Sequence[Mapping[str, Any]], *,
           special_tokens: Mapping[str, str], add_generation_prompt: bool = True,
           kwargs: Mapping[str, Any] | None = None) -> str:
    """The prompt text for `messages`: what `apply_chat_template(messages, tokenize=False,
    add_generation_prompt=..., **kwargs)` returns for a tokenizer with these special tokens.

    A template that refuses the conversation (`raise_exception`, an undefined attribute, a
    type error such as content that is not a string) is a BadInputError carrying its message.
    """
    from jinja2.exceptions import TemplateError

    template = compile_template(source)
    # As transformers: the special tokens first, then the caller's variables over them; the
    # conversation itself is not the caller's to replace.
    context = {"tools": None, "documents": None, **special_tokens, **(kwargs or {}),
               "messages": [dict(m) for m in messages],
               "add_generation_prompt": add_generation_prompt}
    try:
        text: str = template.render(context)
    except (TemplateError, TypeError, ValueError, KeyError, IndexError) as e:
        raise BadInputError(f"the chat template refused these messages: {e}") from e
    return text
