"""A careful PromQL reader for the tests: which metric names, label matchers and grouping labels an
expression uses (not a full parser: enough to check expressions against what gpufleet exports).

Strings are blanked first (a regex in a matcher can hold anything), then range and subquery
selectors (`[5m]`, `[10m:1m]`) are dropped; an identifier followed by `(` is a function or an
aggregation, keywords (`by`, `and`, `offset`, ...) are skipped, and every other identifier is a metric
name, with the labels of the `{...}` matcher that follows it. Grafana's `label_values(metric, label)`
is read as the metric and the label it names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
RANGE = re.compile(r"\[[^\]]*\]")
IDENTIFIER = re.compile(r"(?<![\w.:$])[A-Za-z_:][A-Za-z0-9_:]*")
MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "inf", "nan", "atan2",
}  # fmt: skip


@dataclass
class Usage:
    metrics: dict[str, set[str]] = field(default_factory=dict)  # metric name -> label names it matches on
    grouping: set[str] = field(default_factory=set)  # labels of by/without/on/ignoring/group_* clauses

    def merge(self, other: Usage) -> None:
        for name, labels in other.metrics.items():
            self.metrics.setdefault(name, set()).update(labels)
        self.grouping |= other.grouping


def read(expr: str) -> Usage:
    usage = Usage()
    fixed = LABEL_VALUES.match(expr)
    if fixed:
        usage.metrics[fixed.group(1)] = {fixed.group(2)}
        return usage
    text = STRING.sub('""', expr)
    for match in GROUPING.finditer(text):
        usage.grouping |= {label.strip() for label in match.group(2).split(",") if label.strip()}
    text = GROUPING.sub(" ", text)
    text = RANGE.sub(" ", text)
    for brace in (i for i, c in enumerate(text) if c == "{"):
        before = text[:brace].rstrip()
        if not before or not re.match(r"[A-Za-z0-9_:]", before[-1]):
            # a selector without a metric name, e.g. {__name__=~"..."}, cannot be checked
            raise ValueError(f"selector without a metric name in {expr!r}")
    position = 0
    while True:
        found = IDENTIFIER.search(text, position)
        if found is None:
            break
        name, position = found.group(0), found.end()
        rest = text[position:].lstrip()
        if rest.startswith("(") or name in KEYWORDS:
            continue
        labels: set[str] = set()
        if rest.startswith("{"):
            close = text.index("}", position)
            labels = {m.group(1) for m in MATCHER_LABEL.finditer(text[position:close])}
            position = close + 1
        usage.metrics.setdefault(name, set()).update(labels)
    return usage
