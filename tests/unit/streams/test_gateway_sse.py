"""What an SSE stream sends when laneway restarts an answer (streams.gateway.sse)."""

from __future__ import annotations

import pytest

from streams.gateway.sse import AnswerRestarted, Stitch


def test_deltas_go_out_as_they_come() -> None:
    stitch = Stitch()
    assert [stitch.feed(t) for t in ("The ", "sky ", "is blue.")] == ["The ", "sky ", "is blue."]
    stitch.finish()


def test_a_restart_that_repeats_the_text_sent_continues_after_it() -> None:
    stitch = Stitch()
    assert stitch.feed("The sky ") == "The sky "
    assert stitch.feed("The ", restart=True) == "", "behind what was sent: nothing yet"
    assert stitch.feed("sky is") == "is"
    assert stitch.feed(" blue.") == " blue."
    stitch.finish()
    assert stitch.sent == "The sky is blue."


def test_a_restart_that_contradicts_the_text_sent_ends_the_stream() -> None:
    stitch = Stitch()
    stitch.feed("The sky is green")
    with pytest.raises(AnswerRestarted, match="16 characters were sent"):
        stitch.feed("The sky is blue", restart=True)


def test_an_answer_that_ends_short_of_the_text_sent_is_an_error() -> None:
    stitch = Stitch()
    stitch.feed("The sky is blue.")
    stitch.feed("The sky", restart=True)
    with pytest.raises(AnswerRestarted):
        stitch.finish()


def test_a_restart_before_anything_was_sent_is_free() -> None:
    stitch = Stitch()
    assert stitch.feed("") == ""
    assert stitch.feed("Other", restart=True) == "Other"
    stitch.finish()
