"""Position: the keys that let a source take over from the other without counting a record twice."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.collectors.kernel_position import MAX_RECENT, RECENT_US, Position, text_key


def test_kmsg_text_and_the_journal_text_of_one_record_have_one_key():
    """/dev/kmsg escapes non-ASCII bytes and the backslash; journald stores the text unescaped."""
    journal = "nvme0n1: I/O error \\ on \u201cdata\u201d at sector 7\nsecond line"
    kmsg = "nvme0n1: I/O error \\x5c on \\xe2\\x80\\x9cdata\\xe2\\x80\\x9d at sector 7\\x0asecond line"
    assert text_key(kmsg, kmsg_escaped=True) == text_key(journal)
    assert text_key(journal) != text_key(journal + " ")
    p = Position()
    p.read([(5, kmsg)], kmsg_escaped=True)
    assert p.seen(5, journal)  # read from /dev/kmsg, known when the journal gives it


def test_a_record_read_before_is_seen_and_a_new_one_is_not():
    p = Position()
    assert not p.seen(5_000_000, "a")  # nothing read yet: everything counts
    p.read([(5_000_000, "a"), (5_000_010, "b"), (5_000_010, "c"), (None, "no stamp")])
    assert p.seen(5_000_010, "b") and p.seen(5_000_010, "c") and p.seen(5_000_000, "a")
    assert not p.seen(5_000_010, "d")  # the same microsecond, another text
    assert not p.seen(5_000_011, "a")  # after the highest stamp
    assert not p.seen(5_000_005, "x")  # a little out of order, inside the window, never read
    assert p.seen(4_000_000, "anything")  # below the window: long read
    assert not p.seen(None, "a")  # no stamp: cannot be told apart, so it counts
    assert p.high_us == 5_000_010


def test_the_window_is_bounded_in_time_and_size():
    p = Position()
    p.read([(10_000_000 + i, str(i)) for i in range(MAX_RECENT + 100)])
    assert len(p.recent) == MAX_RECENT and p.recent[0][0] == 10_000_100
    p.read([(10_000_000 + 3 * RECENT_US, "late")])
    assert p.recent == [(10_000_000 + 3 * RECENT_US, text_key("late"))]
    assert p.seen(10_000_500, "500")  # below the window now: read before


def test_a_position_survives_the_state_file():
    p = Position(seq=42, cursor="s=abc;i=1", high_us=7, recent=[(7, "k")])
    assert Position.load(p.dump()) == p
    assert Position.load({}) == Position()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * RECENT_US), st.sampled_from("abcdef")), max_size=300),
       st.integers(0, 300), st.integers(1, 50))
def test_reading_a_log_again_after_any_prefix_counts_each_record_once(records, cut, batch):
    """A log in stamp order, read in batches up to `cut`, then read again from its start by the keys
    alone (a source switch): each record is counted exactly once, as long as no two records share a key."""
    log = sorted(set(records))
    first = Position()
    counted = list(log[:cut])
    for start in range(0, cut, batch):
        first.read(log[start:min(start + batch, cut)])
    again = Position.load(first.dump())
    for us, text in log:
        if not again.seen(us, text):
            again.read([(us, text)])
            counted.append((us, text))
    assert sorted(counted) == log
