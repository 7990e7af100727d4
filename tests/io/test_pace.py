"""The judge of whether pre-reading pays (wds_cloud.io.pace), fed reads of known speed."""

from __future__ import annotations

from wds_cloud.io.pace import FAST_READS, SLOW_WINDOWS, WINDOW, Pace

FAST = WINDOW / FAST_READS / 4  # seconds: a window read at four times the bar
SLOW = WINDOW / FAST_READS * 4  # a window read at a quarter of it


def test_no_pre_reading_until_reads_are_slow() -> None:
    pace = Pace()
    assert not pace.pays
    assert not pace.note(WINDOW, FAST, prereading=False)
    for _ in range(SLOW_WINDOWS - 1):
        assert not pace.note(WINDOW, SLOW, prereading=False)
    assert pace.note(WINDOW, SLOW, prereading=False)
    assert pace.pays


def test_a_window_read_fast_stops_pre_reading() -> None:
    pace = Pace(pays=True)
    assert pace.pays
    assert not pace.note(WINDOW - 1, 0.0, prereading=False)  # not a window yet
    assert pace.pays
    assert pace.note(1, FAST, prereading=False)
    assert not pace.pays
    assert not pace.note(WINDOW, FAST, prereading=False)  # no change: not told again


def test_pre_reading_starts_again_after_slow_windows_in_a_row() -> None:
    pace = Pace()
    pace.note(WINDOW, FAST, prereading=False)
    for _ in range(SLOW_WINDOWS - 1):
        assert not pace.note(WINDOW, SLOW, prereading=False)
        assert not pace.pays
    assert pace.note(WINDOW, SLOW, prereading=False)
    assert pace.pays


def test_a_fast_window_breaks_the_row() -> None:
    pace = Pace()
    pace.note(WINDOW, FAST, prereading=False)
    pace.note(WINDOW, SLOW, prereading=False)
    pace.note(WINDOW, FAST, prereading=False)
    for _ in range(SLOW_WINDOWS - 1):
        assert not pace.note(WINDOW, SLOW, prereading=False)
    assert not pace.pays
    assert pace.note(WINDOW, SLOW, prereading=False)


def test_a_slow_window_while_threads_pre_read_does_not_count() -> None:
    """The consumer may have waited for the GIL, not for its connection; a fast one still
    counts (fast despite the threads)."""
    pace = Pace()
    pace.note(WINDOW, FAST, prereading=False)
    for _ in range(3 * SLOW_WINDOWS):
        assert not pace.note(WINDOW // 2, SLOW / 2, prereading=True)  # half a window each
        assert not pace.note(WINDOW // 2, SLOW / 2, prereading=False)  # the other half
    assert not pace.pays
    pace.note(WINDOW, 0.0, prereading=True)  # fast, while pre-reading: pays stays False
    assert not pace.pays
    pace2 = Pace(pays=True)
    assert pace2.note(WINDOW, FAST, prereading=True)  # fast while pre-reading: stops it
    assert not pace2.pays


def test_the_verdict_for_the_next_consumer() -> None:
    """Pre-reading if the reads turned it on, or it was on for most windows."""
    started_on = Pace(pays=True)
    assert started_on.verdict  # on as given
    for _ in range(2):
        started_on.note(WINDOW, SLOW, prereading=True)
    started_on.note(WINDOW, FAST, prereading=False)  # judged while on, then off
    for _ in range(2):
        started_on.note(WINDOW, FAST, prereading=False)
    assert not started_on.pays and started_on.verdict  # on for 3 windows of 5
    started_on.note(WINDOW, FAST, prereading=False)
    assert not started_on.verdict  # 3 of 6
    pace = Pace()
    assert not pace.verdict
    for _ in range(SLOW_WINDOWS):
        pace.note(WINDOW, SLOW, prereading=False)
    assert pace.pays and pace.verdict
    pace.note(WINDOW, FAST, prereading=False)  # a shard that waited in the kernel's buffers
    assert not pace.pays and pace.verdict  # still: the reads did turn it on
