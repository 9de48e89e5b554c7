"""A streamed answer's pieces as its listener sees them (``workers.backends.pieces``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workers.backends.pieces import AnswerPieces, Utf8Pieces


def test_a_character_split_over_two_tokens_comes_whole() -> None:
    seen: list[str] = []
    pieces = Utf8Pieces(AnswerPieces(seen.append, strip=False))
    data = "café ☕".encode()
    for i in range(len(data)):
        pieces(data[i : i + 1])
    assert "".join(seen) == "café ☕" and all(seen)


@given(st.lists(st.text(alphabet=" \nab", max_size=4), max_size=12))
def test_stripped_pieces_always_begin_the_stripped_answer(parts: list[str]) -> None:
    seen: list[str] = []
    pieces = AnswerPieces(seen.append, strip=True)
    for i, part in enumerate(parts):
        pieces(part)
        assert "".join(parts[: i + 1]).strip().startswith("".join(seen))
    assert "".join(seen) == "".join(parts).strip()
