"""The cascade's full judge is compared by its own instructions too (the manifest's judge.instructions)."""

from __future__ import annotations


def test_a_cascades_full_judge_records_its_instructions():
    """The manifest's judge records the cascade's full judge's own instructions, as the screen's: a changed
    built-in prompt of the full judge is another judge (JudgeRef.differences names it)."""
    from diagsafe_local.engines.identity import engine_identity
    from diagsafe_local.evaluation.manifest import judge_ref
    from diagsafe_local.judging import JUDGES
    from diagsafe_local.judging.config import JudgeConfig

    judge = JudgeConfig.model_validate({"model": "j", "cascade": {"judge": {"model": "f", "rubric": "strongreject"}}})
    ref = judge_ref(judge, engine_identity(judge))
    assert ref.instructions["strongreject"] == JUDGES.get("strongreject").own_prompt
    changed = ref.model_copy(update={"instructions": {**ref.instructions, "strongreject": "another prompt"}})
    assert ref.differences(changed) == ["the instructions of judge strongreject differ"]
