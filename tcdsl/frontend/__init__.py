"""Parse policy text into the IR: a Lark LALR parser whose Transformer runs during the parse.

- ``reader``: reads a policy file and its includes (``Reader``), the one entry point;
- ``source``: reads and decodes one file's text, safely (regular files of bounded size, strict
  UTF-8, newlines normalised), and says where includes may read (``Access``); fmt uses it too;
- ``builder``: the Transformer, rule by rule;
- ``qdiscs``: each qdisc and class kind's parameters, flags and dimensions, and the builder
  of one qdisc's node;
- ``values``: numbers with units, percentages, constants and arithmetic, evaluated into base
  units;
- ``syntax``: the pieces handed from rule to rule, and the names a match may use;
- ``errors``: syntax errors in words.
- ``tables``: subscriber tables (``subscribers from "FILE.csv"``): the csv read once, each
  circuit made a class of the tree that reads it.

Class names (``default bulk``) and percentages are left for ``tcdsl.resolve``. Every problem
becomes a ``Diagnostic``; nothing here raises for bad input.
"""
