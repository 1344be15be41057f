#!/usr/bin/env python3
"""The terminal rules' table in docs/readiness.md, rendered from the code (readiness/rules.py).

    tools/rule_table.py            # print the table
    tools/rule_table.py --write    # put it between the markers in docs/readiness.md
    tools/rule_table.py --check    # exit 1 when the docs' table is not the code's (a unit test runs this)
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout is the modelwake.serving collection

from ansible_collections.modelwake.serving.plugins.module_utils.host import ranks  # noqa: E402
from ansible_collections.modelwake.serving.plugins.module_utils.readiness import rules  # noqa: E402

DOC = os.path.join(ROOT, "docs", "readiness.md")
BEGIN = "<!-- rule-table: begin (tools/rule_table.py --write) -->"
END = "<!-- rule-table: end -->"


def _tests(names):
    return "<br>".join("`%s`" % name.replace("tests/", "", 1) for name in names)


def render():
    lines = ["| # | rule | ends the wait | on what evidence | says | proven by | negative control (must end `ready`) |",
             "|---|---|---|---|---|---|---|"]
    for number, rule in enumerate(rules.RULES, 1):
        if rule is rules.HANG_RULES[0]:
            lines.append("| | *ready* | | *the ready check passed while the server's own processes are alive* | | | |")
        lines.append("| %d | `%s` | `%s` | %s | `%s` | %s | %s |" % (
            number, rule.name, rule.verdict, rule.needs.replace("|", "\\|"), rule.says.replace("|", "\\|"),
            _tests(rule.positive), _tests(rule.negative)))
    titles = ", ".join("`%s`" % pattern.pattern for pattern in ranks.RANK_TITLES)
    lines += ["", "A rank is a process whose title the engine set itself, matched whole: %s. Not a rank: "
              "a child made by `fork()` that carries its parent's title, a helper such as `loader_TP0`, "
              "or a number in an argument (`--node-rank 0`). Engine processes that are no rank: %s "
              "(`plugins/module_utils/host/ranks.py`, with the engines' sources)." % (
                  titles, ", ".join("`%s`" % p.pattern for p in ranks.ENGINE_TITLES))]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    table = render()
    if not (args.write or args.check):
        sys.stdout.write(table)
        return 0
    with open(DOC) as handle:
        text = handle.read()
    if BEGIN not in text or END not in text:
        print("%s has no %s ... %s markers" % (DOC, BEGIN, END))
        return 1
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    new = head + BEGIN + "\n" + table + END + tail
    if args.check:
        if new != text:
            print("docs/readiness.md's rule table is not the code's: run tools/rule_table.py --write")
            return 1
        return 0
    with open(DOC, "w") as handle:
        handle.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
