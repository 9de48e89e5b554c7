"""What the quality loop remembers of an answer for the feedback join."""

from schemas.messages import Path
from streams.quality.loop import Answered


def test_an_answer_is_remembered_with_its_cache_entry() -> None:
    answered = Answered(Path.CACHE, "0f3a")
    assert Answered.from_json(answered.to_json()) == answered
    assert Answered.from_json(Answered(Path.LIGHT).to_json()) == Answered(Path.LIGHT)


def test_the_bare_path_kept_before_cache_keys_still_joins() -> None:
    assert Answered.from_json(b"heavy") == Answered(Path.HEAVY)


def test_unreadable_records_join_nothing() -> None:
    for raw in (b"", b"garbage", b'{"path": "nope"}', b"[1]", b'{"cache_key": "k"}'):
        assert Answered.from_json(raw) is None
