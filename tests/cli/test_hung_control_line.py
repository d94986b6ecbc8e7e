"""A finished check's printout with a control that hung: no rel_l2 to print, "hung (detected)"."""

from __future__ import annotations

from app.cli.output import _control_lines


def test_a_hung_control_prints_hung_detected() -> None:
    result = {
        "controls": [
            {"name": "no_rank_split", "description": "d", "rel_l2": 1.9, "detected": True, "hung": False},
            {
                "name": "no_end_of_epoch_policy",
                "description": "e",
                "rel_l2": None,
                "detected": True,
                "hung": True,
            },
        ],
        "controls_skipped": [],
    }
    lines = _control_lines(result)
    assert "rel_l2 1.9" in lines[0]
    assert lines[1].split() == ["detected", "no_end_of_epoch_policy", "hung", "(detected)", "e"]
