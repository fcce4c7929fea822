"""redact.hide: a known secret leaves a message in every form an error may quote it in."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from kvgate.redact import hide

MARK = st.text(alphabet=string.ascii_letters + string.digits, min_size=8, max_size=16)
NASTY = st.text(alphabet="\n\r\t \"'\\`\x00\x01\x1b\x7f\u2028\u00e9", min_size=0, max_size=6)


@given(first=MARK, middle=NASTY, last=MARK, before=st.text(alphabet=" :;-([", max_size=10))
def test_a_secret_is_hidden_raw_escaped_quoted_or_in_part(
    first: str, middle: str, last: str, before: str
) -> None:
    secret = first + middle + last
    quoted = (
        secret,  # as sent
        ascii(secret),  # repr
        repr(secret.encode("utf-8", "replace")),  # h11: Illegal header value b'Bearer ...'
        secret.encode("unicode_escape").decode(),
        "".join(c if c.isprintable() else ascii(c)[1:-1] for c in secret),  # the CLI's line
        secret.splitlines()[0] if secret.splitlines() else secret,  # only its first line
    )
    for form in quoted:
        text = hide(f"{before}Authorization: Bearer {form} (from the hub)", secret)
        assert first not in text and last not in text, (form, text)


def test_nothing_to_hide_keeps_the_message() -> None:
    assert hide("HTTP 404 for /api/models/org/x", None, "") == "HTTP 404 for /api/models/org/x"
