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


async def test_the_relay_wakes_the_loop_once_for_every_piece_that_came_meanwhile() -> None:
    import asyncio
    import threading

    from workers.backends.pieces import PieceRelay

    loop = asyncio.get_running_loop()
    relay = PieceRelay(loop)
    seen: list[tuple[str, bytes]] = []
    wakeups = 0
    drain = relay._drain

    def counted() -> None:
        nonlocal wakeups
        wakeups += 1
        drain()

    relay._drain = counted  # type: ignore[method-assign]
    a = relay.handler(lambda data: seen.append(("a", data)))
    b = relay.handler(lambda data: seen.append(("b", data)))
    resolved = loop.create_future()

    def decode_step() -> None:  # as the decode thread: pieces, then a future resolved
        for n in range(3):
            a(b"a%d" % n)
            b(b"b%d" % n)
        loop.call_soon_threadsafe(resolved.set_result, None)

    thread = threading.Thread(target=decode_step)
    thread.start()
    thread.join()  # the loop is busy meanwhile, as when a batch's step comes out at once
    await resolved
    assert [d for k, d in seen if k == "a"] == [b"a0", b"a1", b"a2"], "every piece, in order"
    assert len(seen) == 6, "all delivered before the loop saw the future resolved"
    assert wakeups == 1
