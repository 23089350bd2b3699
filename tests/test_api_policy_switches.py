"""`api.gate_policy` takes the gate table's tightening switches for every entry, as `gate --policy ... --require-
offline` does (issue 47): generated from `runs.limits.SWITCHES`, true or false as written."""

from __future__ import annotations

import pytest
from test_policy import entry, online_offline, policy_file  # noqa: F401  (a fixture: an online and an offline run)

import diagsafe_local as ds
from diagsafe_local.core.errors import DiagsafeError


def test_the_api_requires_offline_for_every_entry_as_the_command_line_does(tmp_path, online_offline):  # noqa: F811
    policy = policy_file(tmp_path, entry("a", "offline", max_asr=0.5), entry("b", "online", max_asr=0.5))
    plain = ds.gate_policy(policy, online_offline)
    assert plain.exit_code == 0 and not plain.every_entry
    required = ds.gate_policy(policy, online_offline, require_offline=True)
    assert [o.status for o in required.outcomes] == ["PASS", "MISSING"] and required.exit_code == 3
    assert required.every_entry == {"require_offline": "the command line"}
    assert ds.gate_policy(policy, online_offline, require_offline=False).exit_code == 0
    with pytest.raises(TypeError, match="require_offline must be True or False, got 'yes'"):
        ds.gate_policy(policy, online_offline, require_offline="yes")  # type: ignore[arg-type]
    with pytest.raises(DiagsafeError, match="allow_degenerate_judge cannot be said for every entry"):
        ds.gate_policy(policy, online_offline, allow_degenerate_judge=True)
    with pytest.raises(DiagsafeError, match="require_ofline"):
        ds.gate_policy(policy, online_offline, require_ofline=True)
