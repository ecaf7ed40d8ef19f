"""compare (labkit.compare): runs meet on the stages both captured, and say what they could not compare."""

from __future__ import annotations

import numpy as np
import pytest

import labkit


def test_compare_with_nothing_in_common_raises_and_a_partial_overlap_lists_the_rest():
    from labkit.captures import Run
    from labkit.errors import NoCommonStagesError

    x = np.ones((2, 4), np.float32)
    a = Run("m", "gpu", [1, 2], ["embed", "logits"], {"embed": x})
    b = Run("m", "reference", [1, 2], ["embed", "logits"], {"logits": x})
    with pytest.raises(NoCommonStagesError, match="no captured stage in common"):
        labkit.compare(a, b)
    b.captures["embed"] = x
    cmp = labkit.compare(a, b)
    assert cmp.passed and cmp.missing == ["logits"]
    assert "not compared: logits" in cmp.table() and "not compared" not in cmp.table().replace(
        "not compared: logits", ""
    )
