"""Stop strings over streamed text: held back while they may still match, cut before a match."""

from __future__ import annotations

from workers.stop_strings import StopScanner


def test_stop_scanner_withholds_partial_matches_and_cuts_before_the_stop() -> None:
    scanner = StopScanner(["</end>", "STOP"])
    emitted = []
    for piece in ["hello </", "en", "x S", "TO", "more </e", "nd> tail"]:
        text, stopped = scanner.feed(piece)
        emitted.append(text)
        if stopped:
            break
    assert stopped
    assert "".join(emitted) == "hello </enx STOmore "


def test_stop_scanner_flushes_held_text_when_no_stop_comes() -> None:
    scanner = StopScanner(["STOP"])
    assert scanner.feed("abcST") == ("abc", False)
    assert scanner.flush() == "ST"
