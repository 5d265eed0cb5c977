"""Command-line help as plain text: the tools' descriptions are their module docstrings, written
in reST for the docs (``literal``, :func:`role`); ``--help`` shows them without the markup, and
wraps lines between words only (argparse broke ``flwr-clientapp`` at its hyphen)."""

from __future__ import annotations

import argparse
import re
import textwrap

_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?: <[^>]*>)?`")
_LITERAL = re.compile(r"``([^`]+)``")
_LINK = re.compile(r"`([^`<]+?) <[^>]+>`_")


def plain(text: str) -> str:
    """``text`` without reST markup: literals, roles (their target's text) and links (their words)."""
    return _LITERAL.sub(r"\1", _LINK.sub(r"\1", _ROLE.sub(r"\1", text)))


class PlainFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter for :func:`parser`: descriptions keep their paragraphs, every text is
    wrapped between words, never inside a hyphenated name."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(plain(text).split()), width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = [" ".join(p.split()) for p in plain(text).split("\n\n") if p.strip()]
        return "\n\n".join(textwrap.fill(p, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False) for p in paragraphs)


def parser(prog: str, doc: str, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser whose description is the first paragraph of ``doc`` as plain text."""
    return argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0], formatter_class=PlainFormatter, **kwargs)
