"""A faster drop-in for Lark's contextual lexer, for policies of tens of thousands of lines.

Lark's contextual lexer spends most of its time per token in Python bookkeeping: every run of
blanks is a token of its own that is matched, counted and thrown away. This lexer skips blanks,
comments and line continuations with one C-level regex, then matches the token with the very
per-parser-state regexes Lark built (same terminals, same priorities, same keyword callbacks),
and keeps line/column counting to the token itself. Anything unusual (an error) is handed back
to Lark's own implementation, so messages are unchanged. ``tests/test_lexer.py`` checks that
both lexers produce the same tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from lark import Token
from lark.lexer import ContextualLexer, LexerState

_SKIP = re.compile(r"(?:[ \t\f]+|#[^\n]*|\\[ \t]*\r?\n)+")


class FastContextualLexer(ContextualLexer):
    """Lark's contextual lexer with a lean inner loop (plugged in with ``_plugins``)."""

    def lex(self, lexer_state: LexerState, parser_state: Any) -> Iterator[Token]:
        text_slice = lexer_state.text
        text: str = text_slice.text
        end: int = text_slice.end
        counter = lexer_state.line_ctr
        pos, line, line_start = counter.char_pos, counter.line, counter.line_start_pos
        lexers = self.lexers
        skip = _SKIP.match
        while True:
            m = skip(text, pos, end)
            if m is not None:
                blank = m.group()
                newlines = blank.count("\n")
                if newlines:
                    line += newlines
                    line_start = pos + blank.rindex("\n") + 1
                pos = m.end()
            if pos >= end:
                counter.char_pos, counter.line, counter.line_start_pos = pos, line, line_start
                counter.column = pos - line_start + 1
                return
            lexer = lexers[parser_state.position]
            match = None
            for mre in lexer.scanner._mres:
                match = mre.match(text, pos, end)
                if match is not None:
                    break
            if match is None:
                # Let Lark raise its own, well-described error from this position.
                counter.char_pos, counter.line, counter.line_start_pos = pos, line, line_start
                counter.column = pos - line_start + 1
                yield from ContextualLexer.lex(self, lexer_state, parser_state)
                return
            value = match.group()
            type_ = match.lastgroup
            assert type_ is not None
            token = Token(type_, value, pos, line, pos - line_start + 1)
            pos = match.end()
            if type_ in lexer.newline_types:
                newlines = value.count("\n")
                if newlines:
                    line += newlines
                    line_start = token.start_pos + value.rindex("\n") + 1  # type: ignore[operator]
            token.end_line = line
            token.end_column = pos - line_start + 1
            token.end_pos = pos
            callback = lexer.callback.get(type_)
            if callback is not None:
                token = callback(token)
            lexer_state.last_token = token
            counter.char_pos = pos
            yield token
