"""Deprecated: the observer hooks moved to ``debatebus.observability`` (``Observer``,
``RequestContext``, and ``Settlement``, which was ``Outcome``). This alias warns, and goes in the
next release."""

from __future__ import annotations

import warnings

from debatebus.observability._observer import Observer, RequestContext, Settlement

__all__ = ["Observer", "Outcome", "RequestContext"]

Outcome = Settlement

warnings.warn("debatebus.observe is deprecated: import Observer, RequestContext and Settlement "
              "(was Outcome) from debatebus.observability", DeprecationWarning, stacklevel=2)
