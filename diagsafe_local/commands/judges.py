"""`diagsafe-local judges`: the judges' cards: what each judges, its identity, the figures published for it and
the validations measured here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from diagsafe_local.commands.common import judge_options, judge_spec, user_errors

if TYPE_CHECKING:
    from diagsafe_local.judging.cards import LocalValidation


@user_errors
@judge_options
def judges(
    name: Annotated[str | None, typer.Argument(help="One judge to show in full (a name or a policy file).")] = None,
    judge_model: Annotated[
        str | None,
        typer.Option(
            "--judge-model",
            help="With NAME: the judge's model (and the judge options as a run would set them), for its whole "
            "identity and the validations stored for exactly that judge.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The card(s) as JSON (JudgeCard / JudgeCards).")] = False,
    judge_settings: dict[str, Any] | None = None,
) -> None:
    """List the judges' cards: what each judges, its identity, its published agreement figure (source, data set,
    n) and the validations `validate` stored for it here (`judge.validation: auto` finds them)."""
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.judging import JUDGES
    from diagsafe_local.judging.cards import JudgeCards, judge_card

    if name is None:
        if judge_model is not None or judge_settings:
            raise DiagsafeError("--judge-model and the judge options describe one judge: name it (judges NAME ...)")
        cards = JudgeCards(cards=[judge_card(judge) for judge in JUDGES])
        if as_json:
            typer.echo(cards.model_dump_json(indent=2))
            return
        width = max(len(card.name) for card in cards.cards)
        for card in cards.cards:
            figure = card.published[0].line() if card.published else "no published figure"
            local = _local(card.validations)
            typer.echo(f"{card.name:<{width}}  {card.measures:<7}  {card.definition[:12]}  {figure}  {local}".rstrip())
        typer.echo(
            "identity: the judge's own prompt, parser and scoring; `judges NAME --judge-model M` gives a whole "
            "judge's identity (its model by content and sampling too)"
        )
        return
    judge = JUDGES.get(name)
    spec = (
        judge_spec(name, judge_model, judge_settings or {})
        if judge_model is not None or not judge.needs_model
        else None
    )
    card = judge_card(judge, spec)
    if as_json:
        typer.echo(card.model_dump_json(indent=2))
        return
    typer.echo(f"{card.name}: {card.description}")
    typer.echo(f"  judges:      {card.measures}")
    typer.echo(f"  source:      {card.source}")
    typer.echo(f"  definition:  {card.definition} (prompt, output constraint, parser, scoring code)")
    typer.echo(
        f"  identity:    {card.identity} (with its model by content and sampling)"
        if card.identity
        else "  identity:    give --judge-model (and the judge options of your run) for the whole judge's identity"
    )
    for published in card.published:
        typer.echo(f"  published:   {published.line()}\n               data set: {published.dataset}")
    if not card.published:
        typer.echo("  published:   no published figure")
    for stored in card.validations:
        typer.echo(
            f"  validated:   {stored.judge} on {stored.gold} {_judged(stored)}: FPR {_rate(stored.fpr)}, FNR "
            f"{_rate(stored.fnr)}; identity {stored.identity[:12]}, {stored.stored_at}, stored in {stored.directory}"
        )
    if not card.validations:
        typer.echo("  validated:   not here (`diagsafe-local validate` stores its result by the judge's identity)")


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _local(validations: list[LocalValidation]) -> str:
    """The newest local validation of a judge, in a few words."""
    if not validations:
        return ""
    newest = validations[0]
    more = f" (+{len(validations) - 1} more)" if len(validations) > 1 else ""
    return (
        f"validated here: {newest.judge} FPR {_rate(newest.fpr)} FNR {_rate(newest.fnr)} "
        f"{_judged(newest)[:-1]}, identity {newest.identity[:12]}){more}"
    )


def _judged(validation: LocalValidation) -> str:
    """'(n=40)', or '(n=36 of 40: no verdict on 4)' where the judge gave none on some gold items."""
    if not validation.missing:
        return f"(n={validation.n:g})"
    return f"(n={validation.n:g} of {validation.n + validation.missing:g}: no verdict on {validation.missing})"
