"""Which chat template arguments a template reads: vLLM keeps a request's `chat_template_kwargs` only where the
template reads them (vllm/renderers/hf.py, resolve_chat_template_kwargs: jinja2.meta.find_undeclared_variables on
the template parsed in its sandbox) and drops the others silently, so a judge whose template does not read its
mode (SingGuard's `policy`, `thinking_type`) would judge in the template's defaults; transformers'
apply_chat_template drops them alike. An engine (vLLM's, transformers') checks the arguments of every judge that
renders through it against its template when it loads, before any request. Behind an OpenAI-compatible endpoint
the template is the server's, unknown here: nothing can be checked."""

from __future__ import annotations

from collections.abc import Mapping

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from diagsafe_local.core.errors import RunFailed


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
