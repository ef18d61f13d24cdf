"""Faster drop-ins for Lark's contextual lexer and LALR driver loop, plugged in through Lark's
``_plugins`` option (the extension point lark-cython uses), for policies of 10,000+ classes.

Profiling a 10,000-class policy showed Lark's per-token bookkeeping as the largest cost:

- the lexer matches every run of blanks as a token of its own, counts it and throws it away;
  ``FastContextualLexer`` skips blanks, comments and line continuations with one C-level
  regex, then matches with the very per-state regexes Lark built (same terminals, priorities
  and keyword callbacks);
- the parser loop hashes and compares grammar ``Rule`` objects (Python-level ``__hash__`` and
  ``__eq__``) on every reduction; ``FastLALRParser`` runs the same parse table flattened into
  plain tuples.

Errors are handed back to Lark's own code at the failing position, so messages are unchanged;
each tells, as ``states_before``, the state stack from before the failing token (LALR may
reduce on a lookahead it then cannot shift), for the list of what could have come there.
Syntax-error recovery (``tcdsl/frontend/recovery.py``) edits the parser's stacks and moves the
lexer, then resumes this loop. ``tests/test_fastlark.py`` checks tokens, parse results and
recovery against stock Lark.

This lexer is THE lexer of the language: the compiler and ``tcdsl fmt`` both read through it
(fmt gets the comments and line continuations it skips through ``lexer_callbacks``), so they
cannot disagree on what a text says. It also refuses blocks and parentheses nested more than
``MAX_NESTING`` deep (``NestingTooDeep``), before anything walks them recursively.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from functools import partial
from typing import Any

from lark import Token, Transformer, Tree
from lark.exceptions import UnexpectedInput
from lark.lexer import ContextualLexer, LexerState, PatternStr
from lark.parse_tree_builder import ChildFilterLALR_NoPlaceholders, ExpandSingleChild
from lark.parsers.lalr_analysis import Shift
from lark.parsers.lalr_interactive_parser import InteractiveParser
from lark.parsers.lalr_parser import LALR_Parser, _Parser
from lark.parsers.lalr_parser_state import ParserState

_SKIP = re.compile(r"(?:[ \t\f]+|#[^\n]*|\\[ \t]*\r?\n)+")
_TRIVIA = re.compile(r"(?P<COMMENT>#[^\n]*)|(?P<CONTINUATION>\\[ \t]*\r?\n)")

MAX_NESTING = 100
"""How deep blocks and parentheses may nest (htb itself allows 8 levels of classes)."""

_OPENS = {"LBRACE": 1, "LPAR": 1, "RBRACE": -1, "RPAR": -1}


class NestingTooDeep(Exception):
    """Blocks or parentheses nest deeper than ``MAX_NESTING``; ``token`` opens one too many."""

    def __init__(self, token: Token) -> None:
        super().__init__(f"nesting deeper than {MAX_NESTING} at line {token.line}")
        self.token = token


class FastContextualLexer(ContextualLexer):
    """Lark's contextual lexer with a lean inner loop (plugged in with ``_plugins``)."""

    def lex(self, lexer_state: LexerState, parser_state: Any) -> Iterator[Token]:
        text_slice = lexer_state.text
        text: str = text_slice.text
        end: int = text_slice.end
        counter = lexer_state.line_ctr
        pos, line, line_start = counter.char_pos, counter.line, counter.line_start_pos
        scanners = self._scanners()
        skip = _SKIP.match
        user_callbacks: dict[str, Any] = getattr(self.root_lexer, "user_callbacks", {})
        trivia: dict[str, Any] = {
            k: user_callbacks[k] for k in ("COMMENT", "CONTINUATION") if k in user_callbacks
        }
        depth = 0
        while True:
            state = parser_state.state_stack[-1]
            scanner = scanners[state]
            # The common case: one regex skips the blanks and matches the token.
            match = scanner.combined(text, pos, end) if scanner.combined is not None else None
            if match is not None:
                type_ = match.lastgroup
                assert type_ is not None
                start = match.start(type_)
                if start != pos:
                    blank = text[pos:start]
                    # Only comments and line continuations hold a '#', a '\\' or a newline.
                    if "\\" in blank or "#" in blank:
                        if trivia:
                            _report_trivia(trivia, text, pos, start, line, line_start)
                        newlines = blank.count("\n")
                        if newlines:
                            line += newlines
                            line_start = pos + blank.rindex("\n") + 1
                    pos = start
            else:
                # No combined regex (yet, or Lark split the terminals in several regexes),
                # or no terminal matches: skip the blanks and try each of Lark's regexes.
                m = skip(text, pos, end)
                if m is not None:
                    blank = m.group()
                    if trivia and ("#" in blank or "\\" in blank):
                        _report_trivia(trivia, text, pos, m.end(), line, line_start)
                    newlines = blank.count("\n")
                    if newlines:
                        line += newlines
                        line_start = pos + blank.rindex("\n") + 1
                    pos = m.end()
                if pos >= end:
                    counter.char_pos, counter.line, counter.line_start_pos = pos, line, line_start
                    counter.column = pos - line_start + 1
                    return
                scanner.used()
                for mre in scanner.mres:
                    match = mre.match(text, pos, end)
                    if match is not None:
                        break
                if match is None:
                    # Let Lark raise its own, well-described error from this position.
                    counter.char_pos, counter.line, counter.line_start_pos = pos, line, line_start
                    counter.column = pos - line_start + 1
                    yield from ContextualLexer.lex(self, lexer_state, parser_state)
                    return
                type_ = match.lastgroup
                assert type_ is not None
            value = match.group(type_)
            end_of = match.end()
            if type_ in scanner.keywords and end_of < end and _WORD_GOES_ON(text, end_of):
                # A keyword is a whole word (found by a tester: 'protoudp' read as 'proto
                # udp', 'protocol tcp' as 'proto' and 'col'): the word is a name, which the
                # parser takes where a name may come and refuses elsewhere.
                value = _NAME(text, pos).group()  # type: ignore[union-attr]
                type_ = "NAME"
                match = None
                end_of = pos + len(value)
            # What Token(type_, value, pos, line, column) does, without its two Python calls.
            token = _new_str(Token, value)
            token.type = type_
            token.value = value
            token.start_pos = pos
            token.line = line
            token.column = pos - line_start + 1
            pos = end_of
            if type_ in scanner.newline_types:  # a terminal that may hold newlines
                newlines = value.count("\n")
                if newlines:
                    line += newlines
                    line_start = token.start_pos + value.rindex("\n") + 1
            token.end_line = line
            token.end_column = pos - line_start + 1
            token.end_pos = pos
            if type_ in _OPENS:
                depth += _OPENS[type_]
                if depth > MAX_NESTING:
                    raise NestingTooDeep(token)
            callback = scanner.callbacks.get(type_)
            if callback is not None:
                token = callback(token)
            lexer_state.last_token = token
            counter.char_pos = pos
            yield token

    def _scanners(self) -> _Scanners:
        cached: _Scanners | None = getattr(self, "_by_state", None)
        if cached is None:
            cached = self._by_state = _Scanners(self.lexers)
        return cached


COMBINE_AFTER = 1000
"""Tokens a state's lexer reads before it gets its one regex for blanks and token: compiling
one costs about what it saves on a thousand tokens (a policy of 100 lines has about as many
in all)."""


class _Scanner:
    """A parser state's lexer: Lark's regexes, the terminals that may hold newlines, the
    callbacks; and, once it has read ``COMBINE_AFTER`` tokens, one regex that skips the blanks
    and matches the token (unless Lark split the terminals in several regexes)."""

    __slots__ = ("callbacks", "combined", "keywords", "mres", "newline_types", "uses")

    def __init__(self, lexer: Any) -> None:
        self.combined: Any = None
        self.mres: list[Any] = lexer.scanner._mres
        self.newline_types: Any = lexer.newline_types
        self.callbacks: dict[str, Any] = lexer.callback
        self.uses = 0
        self.keywords = frozenset(
            t.name
            for t in lexer.terminals
            if isinstance(t.pattern, PatternStr) and t.pattern.value[-1:].isalnum()
        )
        """The terminals that are words (``match``): a word that goes on is not one of them."""

    def used(self) -> None:
        """Count a token read without the combined regex; make it when it is time."""
        self.uses += 1
        if self.uses == COMBINE_AFTER and len(self.mres) == 1:
            # The blanks, then the terminals: possessive, so that when no terminal matches
            # after the blanks the regex does not back into them, and fails.
            pattern = f"{_SKIP.pattern[:-1]}*+(?:{self.mres[0].pattern})"
            self.combined = re.compile(pattern, self.mres[0].flags).match


class _Scanners(dict[int, _Scanner]):
    """Each parser state's lexer, looked up once (a state's regexes are compiled when the
    lexer first meets it, as in Lark)."""

    def __init__(self, lexers: dict[int, Any]) -> None:
        super().__init__()
        self.lexers = lexers
        self.by_lexer: dict[int, _Scanner] = {}

    def __missing__(self, state: int) -> _Scanner:
        lexer = self.lexers[state]
        found = self.by_lexer.get(id(lexer))  # states with the same terminals share a lexer
        if found is None:
            found = self.by_lexer[id(lexer)] = _Scanner(lexer)
        self[state] = found
        return found


_new_str = str.__new__
_WORD_GOES_ON = re.compile(r"[\w-]").match
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*").match


def _report_trivia(
    callbacks: dict[str, Any], text: str, pos: int, end: int, line: int, line_start: int
) -> None:
    """Hand the comments and continuations in ``text[pos:end]`` (skipped blanks) to
    ``callbacks``, as Lark's lexer does for ignored terminals with a callback."""
    for m in _TRIVIA.finditer(text, pos, end):
        start = m.start()
        newlines = text.count("\n", pos, start)
        if newlines:
            line += newlines
            line_start = text.rindex("\n", pos, start) + 1
        pos = start
        type_ = m.lastgroup
        assert type_ is not None
        token = Token(type_, m.group(), start, line, start - line_start + 1)
        token.end_pos = m.end()
        if type_ == "CONTINUATION":
            token.end_line, token.end_column = line + 1, 1
        else:
            token.end_line, token.end_column = line, m.end() - line_start + 1
        callback = callbacks.get(type_)
        if callback is not None:
            callback(token)


# One parse-table entry: (True, next_state) to shift, or (False, size, callback, origin) to
# reduce by a rule of ``size`` symbols, building its value with ``callback``.
Action = tuple[Any, ...]


def _same(children: list[Any]) -> list[Any]:
    return children


class _FastParser(_Parser):
    records_before = True
    """A syntax error's ``states_before`` is the state stack from before the failing token."""

    def parse_from_state(self, state: ParserState[int], last_token: Token | None = None) -> Any:
        """Run the LALR loop over the flattened table; Lark's ``feed_token`` ends the parse
        and raises the errors."""
        rows, gotos, shift_callbacks = self._loop_table(state.parse_conf.callbacks)
        states = state.state_stack
        values = state.value_stack
        push_state = states.append
        push_value = values.append
        token = last_token
        # The stack from before the current token's first reduction, to tell an error (LALR
        # may reduce on a lookahead it then cannot shift); None while there was none.
        before: list[int] | None = None
        try:
            for token in state.lexer.lex(state):  # type: ignore[no-untyped-call]
                ttype = token.type
                action = rows[states[-1]].get(ttype)
                # A reduction is a tuple (size, callback, origin); a shift the next state.
                while action.__class__ is tuple:
                    if before is None:
                        before = states[:]
                    size, callback, origin = action
                    if callback is None:  # one child, passed up as it is
                        top = states[-1] = gotos[states[-2]][origin]
                    else:
                        if size:
                            children = values[-size:]
                            del states[-size:]
                            del values[-size:]
                        else:
                            children = []
                        push_value(callback(children))
                        top = gotos[states[-1]][origin]
                        push_state(top)
                    action = rows[top].get(ttype)
                if action is None:
                    _feed_failing(state, token, states[:] if before is None else before)
                    raise AssertionError("unreachable")  # pragma: no cover
                push_state(action)
                push_value(shift_callbacks[ttype](token) if ttype in shift_callbacks else token)
                before = None
            end = Token.new_borrow_pos("$END", "", token) if token else Token("$END", "", 0, 1, 1)
            try:
                return state.feed_token(end, True)
            except UnexpectedInput as e:
                e.states_before = states[:]  # type: ignore[attr-defined]
                raise
        except UnexpectedInput as e:
            e.interactive_parser = InteractiveParser(self, state, state.lexer)
            raise e

    def _loop_table(
        self, callbacks: Any
    ) -> tuple[list[dict[str, Any]], list[dict[str, int]], dict[str, Any]]:
        """``_table`` as the loop reads it: rows and gotos in lists indexed by state, a shift
        as its next state (an int), a reduction as (size, callback, origin); the terminals'
        callbacks apart."""
        cached: tuple[Any, Any] | None = getattr(self, "_loop", None)
        if cached is not None and cached[0] is callbacks:
            return cached[1]  # type: ignore[no-any-return]
        flat, goto_by_state = self._table(callbacks)
        size = max(flat) + 1
        rows: list[dict[str, Any]] = [{} for _ in range(size)]
        gotos: list[dict[str, int]] = [{} for _ in range(size)]
        shift_callbacks: dict[str, Any] = {}
        for number, row in flat.items():
            gotos[number] = goto_by_state[number]
            for symbol, action in row.items():
                if action[0]:
                    rows[number][symbol] = action[1]
                    if action[2]:
                        shift_callbacks[symbol] = action[2]
                else:
                    rows[number][symbol] = action[1:]
        self._loop = (callbacks, (rows, gotos, shift_callbacks))
        return rows, gotos, shift_callbacks

    def _table(
        self, callbacks: Any
    ) -> tuple[dict[int, dict[str, Action]], dict[int, dict[str, int]]]:
        """The parse table as plain tuples, and the state each state goes to after a rule."""
        cached: tuple[Any, Any] | None = getattr(self, "_flat", None)
        if cached is not None and cached[0] is callbacks:
            return cached[1]  # type: ignore[no-any-return]
        flat: dict[int, dict[str, Action]] = {}
        gotos: dict[int, dict[str, int]] = {}
        for number, actions in self.parse_table.states.items():
            row: dict[str, Action] = {}
            goto: dict[str, int] = {}
            for symbol, (kind, arg) in actions.items():
                if kind is Shift:
                    row[symbol] = (True, arg, callbacks.get(symbol))
                    goto[symbol] = arg
                else:
                    row[symbol] = (
                        False,
                        len(arg.expansion),
                        _lean(callbacks.get(arg, _same), len(arg.expansion)),
                        arg.origin.name,
                    )
            flat[number] = row
            gotos[number] = goto
        self._flat = (callbacks, (flat, gotos))
        return flat, gotos


def _lean(callback: Any, size: int) -> Any:
    """``callback`` (Lark's, for a rule of ``size`` symbols) with the same result in fewer
    Python calls: None for a ``?rule`` of one symbol (its one child is its value); a generated
    function for Lark's child filter, which picks children and splices inlined ``_rule``
    children in a loop interpreted on each reduction; ``Tree(name, children)`` directly where
    the transformer's ``__default__`` would be reached through two more calls."""
    if isinstance(callback, ExpandSingleChild) and size == 1:
        return None
    if isinstance(callback, ChildFilterLALR_NoPlaceholders):
        return _child_filter(callback.to_include, _lean_builder(callback.node_builder))
    return _lean_builder(callback)


def _lean_builder(builder: Any) -> Any:
    if isinstance(builder, ExpandSingleChild):
        inner = _lean_builder(builder.node_builder)
        if inner is not builder.node_builder:
            return ExpandSingleChild(inner)  # type: ignore[no-untyped-call]
        return builder
    if isinstance(builder, partial) and not builder.keywords and len(builder.args) == 1:
        handler = _default_handler(builder.func)
        if handler is not None and getattr(handler, "__func__", None) is Transformer.__default__:
            return partial(Tree, builder.args[0])
    return builder


def _default_handler(func: Any) -> Any:
    """The transformer's ``__default__`` that Lark's ``default_callback`` closure calls."""
    code = getattr(func, "__code__", None)
    if code is None or func.__name__ != "default_callback" or func.__closure__ is None:
        return None
    cells = dict(zip(code.co_freevars, func.__closure__, strict=True))
    cell = cells.get("default_handler")
    return None if cell is None else cell.cell_contents


def _child_filter(to_include: list[tuple[int, bool]], builder: Any) -> Any:
    """A function doing what ``ChildFilterLALR_NoPlaceholders(to_include, builder)`` does."""
    if isinstance(builder, partial) and builder.func is Tree:
        # Most are the inlined repetitions (``_opt*``): build the Tree in the same function.
        return _child_filter_maker(tuple(to_include), True)(builder.args[0])
    return _child_filter_maker(tuple(to_include), False)(builder)


# ``Tree(builder, filtered)`` as generated code: the attributes Tree.__init__ sets, in its order.
_NEW_TREE = [
    "    tree = new(Tree)",
    "    tree.data = builder",
    "    tree.children = filtered",
    "    tree._meta = None",
    "    return tree",
]


@functools.cache
def _child_filter_maker(to_include: tuple[tuple[int, bool], ...], tree: bool) -> Any:
    """The maker of a child filter for ``to_include``; with ``tree``, the filter builds
    ``Tree(builder, filtered)`` itself (``builder`` is then the rule's name)."""
    lines = ["def make(builder):", "  def child_filter(children):"]
    started = False
    for i, inlined in to_include:
        if inlined:
            # Lark reuses the first inlined child's list too (LALR shares no subtree).
            lines.append(f"    filtered {'+=' if started else '='} children[{i}].children")
        elif started:
            lines.append(f"    filtered.append(children[{i}])")
        else:
            lines.append(f"    filtered = [children[{i}]]")
        started = True
    if not started:
        lines.append("    filtered = []")
    lines += _NEW_TREE if tree else ["    return builder(filtered)"]
    lines.append("  return child_filter")
    namespace: dict[str, Any] = {"Tree": Tree, "new": object.__new__}
    exec("\n".join(lines), namespace)  # our own text, made from the grammar's rules
    return namespace["make"]


def _feed_failing(state: ParserState[int], token: Token, before: list[int]) -> None:
    """Let Lark raise its error for ``token``, telling it the stack from ``before``."""
    try:
        state.feed_token(token)
    except UnexpectedInput as e:
        e.states_before = before  # type: ignore[attr-defined]
        raise


class FastLALRParser(LALR_Parser):
    """Lark's LALR parser with ``_FastParser`` as its driver loop."""

    def __init__(self, parser_conf: Any, debug: bool = False, strict: bool = False) -> None:
        super().__init__(parser_conf, debug=debug, strict=strict)
        self.parser = _FastParser(self._parse_table, parser_conf.callbacks, debug)

    @classmethod
    def deserialize(  # type: ignore[override]
        cls, data: Any, memo: Any, callbacks: Any, debug: bool = False
    ) -> Any:
        inst = super().deserialize(data, memo, callbacks, debug)  # type: ignore[no-untyped-call]
        inst.parser = _FastParser(inst._parse_table, callbacks, debug)
        return inst


PLUGINS: dict[str, Any] = {
    "ContextualLexer": FastContextualLexer,
    "LALR_Parser": FastLALRParser,
}
"""The ``_plugins`` option for ``lark.Lark``."""
