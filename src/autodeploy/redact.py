"""Passwords out of every command line autodeploy records or prints (issue 37, case 3).

``--db 'postgresql+psycopg://ad:SECRET@host/db'`` (or ``--storage``, with or without ``=``) reaches the
store's ``command`` columns, a bundle's manifest and README, ``results show`` and tune's ``next:`` lines.
:func:`mask_secrets` is the one function they all go through: the store before it writes, the bundle
exporter and the reports before they show a record an older version wrote. Standard library only: the
CLI calls it for every command line.
"""

from __future__ import annotations

import re
from typing import overload

__all__ = ["MASK", "mask_secrets"]

#: What a password becomes.
MASK = "***"

#: ``scheme://user:PASSWORD@host``: the password runs to the last ``@`` of the word, so a password with an
#: unescaped ``@`` or ``/`` is masked whole (a database name with an ``@`` is masked too: better than a leak).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:]*:)(?P<secret>\S*?)(?=@[^\s@'\"]*(?:[\s'\"]|$))")
#: ``?password=SECRET`` / ``&password=SECRET``: libpq and SQLAlchemy take it from the query string too.
_QUERY = re.compile(r"(?P<head>[?&](?:password|passwd|pwd)=)(?P<secret>[^&\s'\"]*)", re.IGNORECASE)


@overload
def mask_secrets(text: str) -> str: ...
@overload
def mask_secrets(text: None) -> None: ...
def mask_secrets(text: str | None) -> str | None:
    """``text`` with the password of every URL in it replaced by :data:`MASK` (``None`` stays ``None``).

    >>> mask_secrets("autodeploy tune m.onnx --db=postgresql+psycopg://ad:SECRET@host/db")
    'autodeploy tune m.onnx --db=postgresql+psycopg://ad:***@host/db'
    """
    if not text:
        return text
    text = _USERINFO.sub(lambda m: m["head"] + MASK if m["secret"] else m[0], text)
    return _QUERY.sub(lambda m: m["head"] + MASK if m["secret"] else m[0], text)
