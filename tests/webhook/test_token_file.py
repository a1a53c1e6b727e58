"""TokenFile: re-read as the file rotates; a bad file (hostile or half-written) never becomes
the token, and a bad file at start-up is a clear error."""

import logging
from pathlib import Path

import pytest

from webhook.cluster.token import MAX_TOKEN_BYTES, TokenError, TokenFile, read_token


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _rotate(path: Path, token: str) -> None:
    """As the kubelet does: a new file renamed over the old one."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(token)
    fresh.replace(path)


def test_a_changed_file_is_read_at_the_next_check_and_not_before(tmp_path: Path) -> None:
    path, clock = tmp_path / "token", Clock()
    path.write_text("first\n")
    tokens = TokenFile(str(path), reread_s=60, check_s=1, clock=clock)
    assert tokens.token() == "first"
    _rotate(path, "second")
    clock.now = 0.5
    assert tokens.token() == "first"  # checked at most once a second
    clock.now = 1.0
    assert tokens.token() == "second"
    assert tokens.reads == 2
    clock.now = 5.0
    assert tokens.token() == "second" and tokens.reads == 2  # unchanged: not read again


def test_the_file_is_read_again_every_reread_interval(tmp_path: Path) -> None:
    path, clock = tmp_path / "token", Clock()
    path.write_text("same")
    tokens = TokenFile(str(path), reread_s=60, check_s=1e9, clock=clock)
    clock.now = 59
    tokens.token()
    assert tokens.reads == 1
    clock.now = 60
    tokens.token()
    assert tokens.reads == 2


def test_after_a_401_it_says_whether_a_token_other_than_the_one_sent_is_there(
    tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text("one")
    tokens = TokenFile(str(path), reread_s=1e9, check_s=1e9)
    assert not tokens.renewed_since("one")
    _rotate(path, "two")
    assert tokens.renewed_since("one") and tokens.token() == "two"


def test_two_requests_refused_with_the_old_token_both_retry(tmp_path: Path) -> None:
    """A watch and a call both sent "one" and both got a 401; the watch re-read first. The
    call must still retry: comparing with the token held before its own re-read would say
    nothing changed (seen in CI as a 401 right after a rotation)."""
    path = tmp_path / "token"
    path.write_text("one")
    tokens = TokenFile(str(path), reread_s=1e9, check_s=1e9)
    watch_sent = call_sent = tokens.token()
    _rotate(path, "two")
    assert tokens.renewed_since(watch_sent)
    assert tokens.renewed_since(call_sent)
    assert not tokens.renewed_since(tokens.token())  # refused with the new token: no retry


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"  \n", "is empty"),
        (b"abc\r\nX-Injected: 1", "characters a bearer token cannot have"),
        (b"abc def", "characters a bearer token cannot have"),
        (b"t\xc3\xa9st", "characters a bearer token cannot have"),
        (b"a" * (MAX_TOKEN_BYTES + 1), f"is over {MAX_TOKEN_BYTES} bytes"),
    ],
)
def test_a_bad_file_keeps_the_last_good_token_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, message: str
) -> None:
    path = tmp_path / "token"
    path.write_text("good")
    tokens = TokenFile(str(path), reread_s=1e9, check_s=1e9)
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert not tokens.renewed_since("good")
    assert tokens.token() == "good"
    assert message in caplog.text and "still using the token read before" in caplog.text
    with pytest.raises(TokenError, match=message):
        read_token(str(path))


def test_a_missing_file_at_start_up_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TokenError, match=f"cannot read the token file {tmp_path}/none"):
        TokenFile(str(tmp_path / "none"))
