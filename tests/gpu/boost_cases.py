#!/usr/bin/env python3
"""One verdict line per test case of a Boost.Test executable, for
tests/gpu/run_gpu_checks.sh to count:

    check: PREFIX/PATH: passed|failed|skipped: WHY

Inputs: the case list (the executable's `--list_content`, which Boost.Test
writes to stderr), and, when the executable ran, its XML report
(`--report_format=XML --report_level=detailed --report_sink=FILE`), its log
(`--log_level=test_suite`, for the reasons of skips and failures) and its
exit status. A case the report lists as skipped is skipped, with the reason
its precondition gave; one it does not list, or lists as aborted, failed,
unless `--skipped-why` says the whole run was skipped (the executable exited
77 before running any case, e.g. no GPU), which makes every case skipped.
A run that exited non-zero with no failed case in its report adds one
failed line for the executable itself (it crashed, or its main failed).
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ET


def listed_cases(text):
    """The leaf paths of a `--list_content` tree (4 spaces per level)."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^( *)(\S+?)\*?$", line)
        if not m:
            continue
        rows.append((len(m.group(1)) // 4, m.group(2)))
    paths = []
    stack = []
    for i, (depth, name) in enumerate(rows):
        del stack[depth:]
        stack.append(name)
        is_leaf = i + 1 == len(rows) or rows[i + 1][0] <= depth
        if is_leaf:
            paths.append("/".join(stack))
    return paths


def reported_cases(path):
    """{case path: result} from an XML report (paths below the module)."""
    results = {}

    def walk(node, prefix):
        for child in node:
            name = child.get("name", "?")
            here = f"{prefix}/{name}" if prefix else name
            if child.tag == "TestCase":
                results[here] = child.get("result", "?")
            elif child.tag == "TestSuite":
                walk(child, here)

    root = ET.parse(path).getroot()
    for module in root.findall("TestSuite"):
        walk(module, "")
    return results


def log_reasons(text):
    """{case path: why} from a test_suite log: skip reasons, first errors."""
    why = {}
    for line in text.splitlines():
        m = re.search(r'Test case "([^"]+)" is skipped because (.*)$', line)
        if m:
            why.setdefault(m.group(1), m.group(2))
            continue
        m = re.search(r'(?:fatal )?error: in "([^"]+)": (.*)$', line)
        if m:
            why.setdefault(m.group(1), m.group(2))
    return why


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", required=True, help="name before each case path")
    ap.add_argument("--list", required=True, help="file with the --list_content output")
    ap.add_argument("--report", help="XML report of the run")
    ap.add_argument("--log", help="log of the run (--log_level=test_suite)")
    ap.add_argument("--status", type=int, default=0, help="the run's exit status")
    ap.add_argument("--skipped-why", help="the run was skipped as a whole, for this reason")
    a = ap.parse_args()

    with open(a.list, errors="replace") as f:
        cases = listed_cases(f.read())
    if not cases:
        print(f"check: {a.prefix}: failed: --list_content listed no test case")
        return
    if a.skipped_why:
        for c in cases:
            print(f"check: {a.prefix}/{c}: skipped: {a.skipped_why}")
        return

    results = {}
    if a.report:
        try:
            results = reported_cases(a.report)
        except (OSError, ET.ParseError) as e:
            print(f"check: {a.prefix}: failed: no readable report ({e}), exit status {a.status}")
    why = {}
    if a.log:
        try:
            with open(a.log, errors="replace") as f:
                why = log_reasons(f.read())
        except OSError:
            pass
    any_failed = False
    for c in cases:
        r = results.get(c)
        reason = why.get(c, "")
        if r == "passed":
            print(f"check: {a.prefix}/{c}: passed: ok")
        elif r == "skipped":
            print(f"check: {a.prefix}/{c}: skipped: {reason or 'skipped (no reason logged)'}")
        else:
            any_failed = True
            what = r if r else f"no result (the run ended with exit status {a.status})"
            print(f"check: {a.prefix}/{c}: failed: {what}{': ' + reason if reason else ''}")
    for c in sorted(set(results) - set(cases)):
        print(f"check: {a.prefix}/{c}: failed: reported but not listed ({results[c]})")
        any_failed = True
    if a.status != 0 and not any_failed:
        print(f"check: {a.prefix}: failed: exit status {a.status} with no failed case reported")


if __name__ == "__main__":
    sys.exit(main())
