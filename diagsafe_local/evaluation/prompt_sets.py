"""Public prompt sets by short name: where each comes from, its license and size, and how its rows
become items (keeping id, category, source and any behaviour context).

`fetch` downloads a set into `<cache>/prompt_sets/NAME/` where the machine is online (the Hugging Face
Hub or the project's release URL); offline nodes read that cache, or a local file given as
`dataset.path`. Fetch on a login node, run on the compute node.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagsafe_local.core.cache import cache_dir
from diagsafe_local.core.errors import DataError, DiagsafeError
from diagsafe_local.core.hub import download
from diagsafe_local.core.messages import Message
from diagsafe_local.core.registry import Registry
from diagsafe_local.core.tables import table_rows
from diagsafe_local.evaluation.config import DatasetConfig
from diagsafe_local.evaluation.items import Item, harmmetric_items, load_items


@dataclass(frozen=True)
class PromptSet:
    """One public prompt set."""

    name: str
    description: str
    license: str
    size: str
    measures: str
    filename: str
    url: str | None = None
    hub_repo: str | None = None
    hub_file: str | None = None
    parse: Callable[[Path], list[Item]] = lambda path: []
    shipped: Path | None = None  # a file that comes with the set's package (a plugin's prompts): nothing to fetch

    def cached_path(self) -> Path:
        return self.shipped or cache_dir() / "prompt_sets" / self.name / self.filename


def _plugin_set(obj: Any, name: str) -> list[PromptSet]:
    """A `diagsafe_local.prompt_sets` entry point: a PromptSet (or a callable returning one)."""
    made = obj() if callable(obj) and not isinstance(obj, PromptSet) else obj
    if not isinstance(made, PromptSet):
        raise TypeError(f"expected a diagsafe_local PromptSet, got {type(made).__name__}")
    return [made]


PROMPT_SETS: Registry[PromptSet] = Registry("prompt set", plugin_group="diagsafe_local.prompt_sets", adapt=_plugin_set)


def _need(path: Path, line: int, row: dict[str, Any], field: str) -> str:
    value = row.get(field)
    if value is None or not str(value).strip():
        raise DataError(path, line, field, "missing")
    return str(value)


def _user(text: str) -> tuple[Message, ...]:
    return (Message(role="user", content=text),)


def _harmbench(functional: str) -> Callable[[Path], list[Item]]:
    """HarmBench behaviors CSV (`harmbench_behaviors_text_all.csv`: Behavior, FunctionalCategory, SemanticCategory,
    Tags, ContextString, BehaviorID; a row has a ContextString exactly where its Tags name `context`)."""

    def parse(path: Path) -> list[Item]:
        from diagsafe_local.judging.harmbench import CONTEXT_SEPARATOR

        items = []
        for line, row in table_rows(path):
            if (row.get("FunctionalCategory") or "standard") != functional:
                continue
            behavior = _need(path, line, row, "Behavior")
            context = row.get("ContextString") or ""
            # HarmBench's baselines place the context before the behavior, separated by a rule (the HarmBench
            # classifier's contextual prompt takes the two apart at the same separator).
            prompt = f"{context}{CONTEXT_SEPARATOR}{behavior}" if context else behavior
            items.append(
                Item(
                    id=_need(path, line, row, "BehaviorID"),
                    messages=_user(prompt),
                    category=row.get("SemanticCategory") or "",
                    source=f"harmbench-{functional}",
                )
            )
        return items

    return parse


def _advbench(path: Path) -> list[Item]:
    return [
        Item(
            id=f"advbench-{line - 1}",
            messages=_user(_need(path, line, row, "goal")),
            category="advbench",
            source="advbench",
        )
        for line, row in table_rows(path)
    ]


def _strongreject(path: Path) -> list[Item]:
    return [
        Item(
            id=f"strongreject-{line - 1}",
            messages=_user(_need(path, line, row, "forbidden_prompt")),
            category=row.get("category") or "",
            source=row.get("source") or "strongreject",
        )
        for line, row in table_rows(path)
    ]


def _jbb(benign: bool) -> Callable[[Path], list[Item]]:
    """JailbreakBench behaviors CSV: Index, Goal, Target, Behavior, Category, Source."""

    def parse(path: Path) -> list[Item]:
        kind = "benign" if benign else "harmful"
        return [
            Item(
                id=f"jbb-{kind}-{_need(path, line, row, 'Index')}",
                messages=_user(_need(path, line, row, "Goal")),
                category=row.get("Category") or "",
                source=f"jbb-{kind}:{row.get('Source') or ''}",
                benign=benign,
            )
            for line, row in table_rows(path)
        ]

    return parse


def _xstest(path: Path) -> list[Item]:
    """XSTest prompts CSV: id, prompt, type, label (safe | unsafe); safe prompts measure over-refusal."""
    items = []
    for line, row in table_rows(path):
        label = _need(path, line, row, "label")
        if label not in ("safe", "unsafe"):
            raise DataError(path, line, "label", f"must be 'safe' or 'unsafe', got {label!r}")
        items.append(
            Item(
                id=f"xstest-{_need(path, line, row, 'id')}",
                messages=_user(_need(path, line, row, "prompt")),
                category=row.get("type") or "",
                source="xstest",
                benign=label == "safe",
            )
        )
    return items


def _mhj(path: Path) -> list[Item]:
    """Multi-turn human jailbreaks (Scale AI MHJ layout): question_id, tactic, message_0..message_N, each a JSON
    object {"role", "body"}. Recorded assistant turns are replayed; a final recorded answer is dropped so the
    target answers the last user turn itself."""
    items = []
    for line, row in table_rows(path):
        messages: list[Message] = []
        keys = sorted((k for k in row if k.startswith("message_") and row[k]), key=lambda k: int(k.split("_")[1]))
        for key in keys:
            try:
                message = json.loads(row[key]) if isinstance(row[key], str) else row[key]
                messages.append(Message(role=message["role"], content=message["body"]))
            except (ValueError, KeyError, TypeError):
                raise DataError(path, line, key, 'must be a JSON object {"role": ..., "body": ...}') from None
        while messages and messages[-1].role == "assistant":
            messages.pop()
        if not any(m.role == "user" for m in messages):
            raise DataError(path, line, "message_0", "the transcript has no user turn")
        items.append(
            Item(
                id=f"mhj-{_need(path, line, row, 'question_id')}-{line}",
                messages=tuple(messages),
                category=row.get("source") or "",
                source="mhj",
                attack_method=row.get("tactic") or "multi-turn",
            )
        )
    return items


def _harmmetric(path: Path) -> list[Item]:
    return harmmetric_items(path)


_HARMBENCH_URL = "https://raw.githubusercontent.com/centerforaisafety/HarmBench/main/data/behavior_datasets/harmbench_behaviors_text_all.csv"
for functional, size in (("standard", "200"), ("contextual", "100"), ("copyright", "100")):
    PROMPT_SETS.add(
        PromptSet(
            name="harmbench" if functional == "standard" else f"harmbench-{functional}",
            description=f"HarmBench {functional} behaviors"
            + (" (with their context string)" if functional == "contextual" else ""),
            license="MIT",
            size=f"{size} behaviors",
            measures="harmful compliance by semantic category",
            filename="harmbench_behaviors_text_all.csv",
            url=_HARMBENCH_URL,
            parse=_harmbench(functional),
        )
    )
PROMPT_SETS.add(
    PromptSet(
        name="advbench",
        description="AdvBench harmful behaviors (Zou et al. 2023)",
        license="MIT",
        size="520 prompts",
        measures="harmful compliance",
        filename="harmful_behaviors.csv",
        url="https://raw.githubusercontent.com/llm-attacks/llm-attacks/main/data/advbench/harmful_behaviors.csv",
        parse=_advbench,
    )
)
PROMPT_SETS.add(
    PromptSet(
        name="strongreject",
        description="StrongREJECT forbidden prompts",
        license="MIT",
        size="313 prompts",
        measures="harmful compliance by category",
        filename="strongreject_dataset.csv",
        url="https://raw.githubusercontent.com/alexandrasouly/strongreject/main/strongreject_dataset/strongreject_dataset.csv",
        parse=_strongreject,
    )
)
for kind, benign in (("harmful", False), ("benign", True)):
    PROMPT_SETS.add(
        PromptSet(
            name=f"jbb-{kind}",
            description=f"JailbreakBench {kind} behaviors",
            license="MIT",
            size="100 behaviors",
            measures="harmful compliance" if not benign else "over-refusal on matched benign behaviors",
            filename=f"{kind}-behaviors.csv",
            hub_repo="JailbreakBench/JBB-Behaviors",
            hub_file=f"data/{kind}-behaviors.csv",
            parse=_jbb(benign),
        )
    )
PROMPT_SETS.add(
    PromptSet(
        name="xstest",
        description="XSTest: safe prompts that look unsafe, and unsafe contrasts",
        license="CC-BY-4.0",
        size="250 safe + 200 unsafe",
        measures="over-refusal (safe) and harmful compliance (unsafe)",
        filename="xstest_prompts.csv",
        url="https://raw.githubusercontent.com/paul-rottger/xstest/main/xstest_prompts.csv",
        parse=_xstest,
    )
)
PROMPT_SETS.add(
    PromptSet(
        name="mhj",
        description="Multi-turn human jailbreaks (Scale AI MHJ layout), replayed turn by turn",
        license="CC-BY-NC-4.0 (gated: accept the terms on the Hub)",
        size="537 conversations",
        measures="harmful compliance under multi-turn attacks",
        filename="harmbench_behaviors.csv",
        hub_repo="ScaleAI/mhj",
        hub_file="harmbench_behaviors.csv",
        parse=_mhj,
    )
)
PROMPT_SETS.add(
    PromptSet(
        name="harmmetric",
        description="HarmMetric Eval prompts with their reference answers",
        license="MIT",
        size="274 prompts",
        measures="harmful compliance; reference-based metrics can score answers too",
        filename="HarmMetric_Eval.jsonl",
        hub_repo="Abel-24/HarmMetric_Eval",
        parse=_harmmetric,
    )
)


def fetch(name: str) -> Path:
    """Download a set into the cache (once); returns the cached file."""
    spec = PROMPT_SETS.get(name)
    target = spec.cached_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".partial")
    try:
        if spec.url:
            return download(spec.url, target)
        else:
            from huggingface_hub import hf_hub_download

            if spec.hub_file:
                shutil.copyfile(
                    hf_hub_download(
                        str(spec.hub_repo), spec.hub_file, repo_type="dataset", cache_dir=cache_dir() / "hub"
                    ),
                    partial,
                )
            else:
                from diagsafe_local.core.hub import resolve_dataset

                shutil.copyfile(resolve_dataset(spec.hub_repo), partial)  # type: ignore[arg-type]
    except Exception as exc:  # network and hub errors of every kind mean the same to the user
        partial.unlink(missing_ok=True)
        raise DiagsafeError(
            f"could not download prompt set '{name}' ({type(exc).__name__}: {exc}). Offline? Run "
            f"`diagsafe-local data fetch {name}` where you are online (same DIAGSAFE_CACHE), or set dataset.path "
            "to a local copy."
        ) from None
    partial.rename(target)
    return target


def load_set(name: str, local: Path | None = None) -> tuple[list[Item], Path]:
    """Items of a named set, from `local` if given, else the cache (downloading if needed)."""
    spec = PROMPT_SETS.get(name)
    path = local if local is not None else fetch(name)
    if not path.is_file():
        raise DataError(path, None, None, f"no such file (a local copy of prompt set '{name}')")
    items = spec.parse(path)
    if not items:
        raise DataError(path, None, None, f"no items of prompt set '{name}' in this file")
    return items, path


def load_configured(config: DatasetConfig) -> tuple[list[Item], Path]:
    """The run's items: a named set (`dataset.set`, from `dataset.path` if given) or a file / hub id."""
    if config.set:
        items, path = load_set(config.set, Path(config.path) if config.path else None)
    else:
        from diagsafe_local.core.hub import resolve_dataset

        path = resolve_dataset(config.path)  # type: ignore[arg-type]
        items = load_items(config, path)
    return (items[: config.limit] if config.limit else items), path
