"""The one verdict rule (drafting/verdict.py) on hand-made figures: pure Python."""

from mlxspec.drafting.verdict import FASTER, NOISE, PLAIN, SLOWER, UNMEASURED_BAND, verdict


def test_a_speedup_is_judged_as_it_is_shown():
    """CI at stop 48: a run's speedup of 1.0497, shown as "1.05x", was called "made little
    difference" beside the 5% band while its line read 1.05x. The verdict reads the figure at
    the two places every view shows."""
    band = UNMEASURED_BAND
    assert verdict(1.0497, band=band, accepted=True) == FASTER
    assert verdict(1.0449, band=band, accepted=True) == NOISE
    assert verdict(0.9504, band=band, accepted=True) == SLOWER
    assert verdict(0.9551, band=band, accepted=True) == NOISE


def test_the_band_and_what_was_accepted_decide_the_rest():
    assert verdict(None, band=0.05, accepted=True) is None
    assert verdict(1.30, band=None, accepted=True) == NOISE  # no band measured: nothing told from noise
    assert verdict(1.30, band=0.40, accepted=True) == NOISE
    assert verdict(1.30, band=0.10, accepted=True) == FASTER
    assert verdict(0.70, band=0.10, accepted=True) == SLOWER
    assert verdict(1.30, band=0.10, accepted=False) == PLAIN  # faster without an accepted draft is the machine
    assert verdict(1.02, band=0.10, accepted=False) == PLAIN
    assert verdict(0.70, band=0.10, accepted=False) == SLOWER
