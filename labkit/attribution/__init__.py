"""Attribution: which stage made an error, and which only inherited it (labkit.attribute)."""

from labkit.attribution.attribute import BAND_FLOOR, GUILT_FACTOR, attribute
from labkit.attribution.report import Attribution, StageAttribution
from labkit.attribution.verdict import verdict

__all__ = ["BAND_FLOOR", "GUILT_FACTOR", "Attribution", "StageAttribution", "attribute", "verdict"]
