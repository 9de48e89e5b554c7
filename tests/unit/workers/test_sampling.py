"""The sampler and the stop-string scanner, as pure functions."""

from __future__ import annotations

import numpy as np

from workers.backends.sampling import (
    REPEAT_LAST_N,
    Sampler,
    StopScanner,
    choose_token,
    nucleus,
    penalize,
    stop_prefix_len,
)


def logits(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_greedy_at_temperature_zero_takes_the_argmax() -> None:
    rng = np.random.default_rng(0)
    assert choose_token(logits(0.1, 3.0, 2.9, -1.0), 0.0, rng) == 1


def test_a_seeded_sampler_draws_the_same_tokens_and_another_seed_differs() -> None:
    scores = np.linspace(-1, 1, 50, dtype=np.float32)

    def draws(seed: int) -> list[int]:
        sampler = Sampler(temperature=1.5, seed=seed, repeat_penalty=1.0)
        return [sampler.sample(scores) for _ in range(40)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert len(set(draws(7))) > 5  # a real distribution, not the argmax


def test_temperature_sharpens_towards_the_argmax() -> None:
    scores = logits(0.0, 1.0, 2.0)
    rng = np.random.default_rng(3)
    cold = [choose_token(scores, 0.05, rng) for _ in range(200)]
    hot = [choose_token(scores, 5.0, rng) for _ in range(200)]
    assert cold.count(2) == 200
    assert len(set(hot)) == 3


def test_a_small_top_p_always_takes_the_top_token() -> None:
    scores = logits(0.1, 3.0, 2.9, -1.0)
    rng = np.random.default_rng(5)
    assert {choose_token(scores, 2.0, rng, top_p=0.01) for _ in range(200)} == {1}


def test_top_p_draws_only_from_the_nucleus_and_from_all_of_it() -> None:
    # Probabilities about .64, .24, .09, .03 (softmax of 3, 2, 1, 0):
    # top_p .8 keeps the first two (.64 < .8 <= .88), never the others.
    scores = logits(1.0, 3.0, 0.0, 2.0)
    assert nucleus(scores, 0.8).tolist() == [1, 3]
    assert nucleus(scores, 0.64).tolist() == [1]  # reaching top_p is enough
    assert nucleus(scores, 0.9).tolist() == [1, 3, 0]
    assert nucleus(scores, 1.0).tolist() == [1, 3, 0, 2]
    rng = np.random.default_rng(11)
    drawn = [choose_token(scores, 1.0, rng, top_p=0.8) for _ in range(2000)]
    assert set(drawn) == {1, 3}
    # Within the nucleus the temperature softmax decides: .64 / .88 of the draws.
    assert abs(drawn.count(1) / len(drawn) - 0.73) < 0.04


def test_the_nucleus_of_a_flat_vocabulary_is_found_past_the_first_candidates() -> None:
    scores = np.zeros(49_152, dtype=np.float32)
    scores[:10] = 1.0  # a few likelier tokens, then a long flat tail
    kept = nucleus(scores, 0.5)
    tail = np.exp(-1.0)  # each flat token's weight against a likelier one's 1
    expected = 10 + np.ceil((0.5 * (10 + 49_142 * tail) - 10) / tail)
    assert abs(len(kept) - expected) <= 1  # float rounding of the sums
    assert set(kept[:10].tolist()) == set(range(10))
    assert len(set(kept.tolist())) == len(kept)


def test_top_p_of_one_samples_as_without_it() -> None:
    scores = np.linspace(-1, 1, 50, dtype=np.float32)

    def draws(**top_p: float) -> list[int]:
        sampler = Sampler(temperature=1.5, seed=3, repeat_penalty=1.0, **top_p)
        return [sampler.sample(scores) for _ in range(40)]

    assert draws(top_p=1.0) == draws()
    assert draws(top_p=0.3) == draws(top_p=0.3)  # still seeded
    assert draws(top_p=0.3) != draws()


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    scores = logits(2.0, -2.0, 1.0, 4.0)
    out = penalize(scores, [0, 1, 1, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0, 4.0]  # once per distinct token
    assert scores.tolist() == [2.0, -2.0, 1.0, 4.0]  # the caller's logits are left alone
    assert penalize(scores, [0], 1.0) is scores


def test_the_penalty_can_turn_greedy_away_from_a_repeated_token() -> None:
    sampler = Sampler(temperature=0.0, seed=0, repeat_penalty=1.5)
    scores = logits(3.0, 2.5)
    assert sampler.sample(scores) == 0
    sampler.accept(0)
    assert sampler.sample(scores) == 1  # 3.0 / 1.5 < 2.5


def test_the_penalty_forgets_tokens_older_than_its_window() -> None:
    sampler = Sampler(temperature=0.0, seed=0, repeat_penalty=1.5)
    sampler.accept(0)
    for _ in range(REPEAT_LAST_N):
        sampler.accept(5)
    assert sampler.sample(logits(3.0, 2.5, 0, 0, 0, 0)) == 0


def test_stop_prefix_len_is_the_longest_tail_that_starts_a_stop() -> None:
    stops = [b"\nQuestion:", b"\n\n"]
    assert stop_prefix_len(b"Paris.\nQues", stops) == 5
    assert stop_prefix_len(b"Paris.\n", stops) == 1
    assert stop_prefix_len(b"Paris.", stops) == 0
    assert stop_prefix_len(b"", stops) == 0


def test_scanner_holds_back_a_possible_stop_and_releases_it_when_it_is_not() -> None:
    scanner = StopScanner(["\nQuestion:"])
    assert not scanner.feed(b"Paris.")
    assert not scanner.feed(b"\nQue")
    assert scanner.released == b"Paris."  # "\nQue" could still become the stop
    assert not scanner.feed(b"en")
    assert scanner.released == b"Paris.\nQueen"
    assert scanner.text() == "Paris.\nQueen"


def test_scanner_cuts_at_a_stop_split_over_tokens() -> None:
    scanner = StopScanner(["END", "\n\n"])
    for piece in [b"one ", b"two E", b"N"]:
        assert not scanner.feed(piece)
    assert scanner.feed(b"D three")
    assert scanner.stopped
    assert scanner.text() == "one two " and scanner.released == b"one two "


def test_scanner_stops_at_the_earliest_of_several_stops() -> None:
    scanner = StopScanner(["b", "a"])
    assert scanner.feed(b"xxab")
    assert scanner.text() == "xx"


def test_scanner_without_stops_keeps_everything_and_multibyte_characters() -> None:
    scanner = StopScanner([])
    euro = "€".encode()
    assert not scanner.feed(euro[:1])
    assert not scanner.feed(euro[1:])
    assert scanner.text() == "€"
