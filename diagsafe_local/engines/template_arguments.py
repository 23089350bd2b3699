"""Which chat template arguments a template reads: vLLM keeps a request's `chat_template_kwargs` only where the
template reads them (vllm/renderers/hf.py, resolve_chat_template_kwargs: jinja2.meta.find_undeclared_variables on
the template parsed in its sandbox) and drops the others silently, so a judge whose template does not read its
mode (SingGuard's `policy`, `thinking_type`) would judge in the template's defaults; transformers'
apply_chat_template drops them alike. An engine (vLLM's, transformers') checks the arguments of every judge that
renders through it against its template when it loads, before any request. Behind an OpenAI-compatible endpoint
the template is the server's, unknown here: nothing can be checked.

A Mistral-format tokenizer (tekken.json: vLLM's mistral mode, transformers' MistralCommonBackend) renders with
mistral_common, no template: it takes reasoning_effort alone, and only from tokenizer version 15
(`check_mistral_arguments`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from diagsafe_local.core.errors import RunFailed
from diagsafe_local.engines.config import MISTRAL_TEMPLATE_ARGUMENTS

REASONING_EFFORT_VERSION = 15  # the mistral_common tokenizer version from which reasoning_effort reaches it


class _Generation(jinja2.ext.Extension):
    """The `{% generation %}` block of assistant-mask templates, parsed as vLLM parses it (renderers/hf.py,
    AssistantTracker), so such a template's variables are found too."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def template_variables(template: str) -> frozenset[str]:
    """The variables a Jinja chat template reads (what vLLM passes a template argument on for)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))


def check_template_arguments(template: str, arguments: Mapping[str, str], where: str) -> None:
    """Refuse (RunFailed) an argument (name -> the judge that sends it) that `template`, described by `where`,
    does not read; or a template that does not parse while arguments are to reach it."""
    if not arguments:
        return
    try:
        read = template_variables(template)
    except jinja2.TemplateSyntaxError as exc:
        raise RunFailed(f"{where} does not parse ({exc}): cannot tell whether it reads its judge's arguments") from None
    for name, judge in arguments.items():
        if name not in read:
            raise RunFailed(
                f"judge '{judge}' sends the chat template argument '{name}', which {where} does not read: the "
                "engine would drop it and the judge would run in the template's default mode; give it a template that "
                "reads it (the model's own, as released)"
            )


def mistral_version(tokenizer: Any) -> int:
    """The version of a mistral_common tokenizer (15 for v15), read as vLLM reads it (tokenizers/mistral.py,
    MistralTokenizer.__init__), from vLLM's MistralTokenizer or transformers' MistralCommonBackend."""
    inner = getattr(tokenizer, "tokenizer", tokenizer)  # MistralTokenizer.tokenizer is mistral_common's Tokenizer
    inner = getattr(getattr(inner, "instruct_tokenizer", None), "tokenizer", inner)  # MistralCommonBackend's
    return int(str(inner.version.value).split("v")[-1])


def check_mistral_arguments(version: int, arguments: Mapping[str, str], where: str) -> None:
    """Refuse an argument that mistral_common, rendering the chat for a tokenizer of `version`, does not take:
    every one but reasoning_effort, which vLLM passes on only from version 15 (tokenizers/mistral.py,
    MistralTokenizer.apply_chat_template) and mistral_common refuses below it (its validator's
    _validate_model_settings)."""
    taken = MISTRAL_TEMPLATE_ARGUMENTS if version >= REASONING_EFFORT_VERSION else ()
    ignored = {name: judge for name, judge in arguments.items() if name not in taken}
    check_template_arguments("", ignored, f"mistral_common ({where}, tokenizer version v{version})")
