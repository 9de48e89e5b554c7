from workers.breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock) -> CircuitBreaker:
    return CircuitBreaker(failures=3, window_s=10, cooldown_s=5, clock=clock)


def test_opens_after_failures_within_the_window() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(2):
        b.record(ok=False)
    assert b.state == "closed" and b.allow()
    b.record(ok=False)
    assert b.state == "open" and not b.allow()


def test_old_failures_fall_out_of_the_window() -> None:
    clock = Clock()
    b = breaker(clock)
    b.record(ok=False)
    b.record(ok=False)
    clock.now = 11
    b.record(ok=False)
    assert b.state == "closed"


def test_half_open_lets_one_probe_through_and_success_closes() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.record(ok=False)
    clock.now = 5
    assert b.state == "half-open"
    assert b.allow() and not b.allow()  # one probe at a time
    b.record(ok=True)
    assert b.state == "closed" and b.allow()


def test_failed_probe_reopens_for_another_cooldown() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.record(ok=False)
    clock.now = 6
    assert b.allow()
    b.record(ok=False)
    assert b.state == "open"
    clock.now = 10
    assert b.state == "open"
    clock.now = 11
    assert b.state == "half-open"


def test_a_trip_opens_at_once_and_still_probes_after_the_cooldown() -> None:
    clock = Clock()
    b = breaker(clock)
    b.trip()
    assert b.state == "open" and not b.allow()
    clock.now = 5
    assert b.state == "half-open" and b.allow() and not b.allow()  # one probe
    b.trip()  # the probe hit the same error
    assert b.state == "open"
    clock.now = 10
    assert b.allow()
    b.record(ok=True)
    assert b.state == "closed"
