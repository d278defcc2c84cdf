#!/usr/bin/env python3
"""Classify ThreadSanitizer reports into noise (a side in CAF or another
uninstrumented library) and kept reports (every side in this repository's code).

Usage: scripts/tsan-classify.py [--root DIR] [--show-noise N] LOG...
  LOG: a TSan log file (TSAN_OPTIONS log_path=... writes one per process,
  <path>.<pid>) or a directory of them. Prints a summary and every kept report
  in full; exit status 1 when a report is kept (or TSan itself failed), else 0.

Why: CAF 0.17 comes from Debian, built without -fsanitize=thread. Its mailbox,
reference counts and scheduler queues synchronise with atomics TSan never sees,
so every hand-over of a message or an actor between threads can look like a
race. Those reports are noise; a report whose every side is this project's own
code is not, and that set must be empty.

The rule.
  * A report is split into sections: a header line ("Write of size 8 at ... by
    thread T3:", "Previous read ...", "Mutex M1 acquired here while holding
    ...", ...) and the stack under it. The SIDES of a report are its access
    stacks: for a data race or heap-use-after-free the current access and the
    previous one; for a lock-order inversion each "acquired here while holding"
    stack; for single-stack reports (mutex misuse, signal handler, ...) that
    stack. Context sections -- "Location is ...", "Mutex ... created at",
    "Thread ... created by ... at", "... previously acquired by the same thread
    here" -- are not sides, except in a report that has nothing else (a thread
    leak: its only stack is where the thread was created).
  * A side COUNTS AS PROJECT CODE when its topmost frame outside the C/C++
    runtime (libstdc++ and its headers /usr/include/c++, libc/libm/libgcc,
    the dynamic loader, TSan's own interceptors) has a source file inside the
    repository (--root, by default the parent of scripts/; a relative path,
    as ccache's base_dir writes them, is read from --build-dir, by default
    ROOT/build-tsan, where the compiler ran). The frame that
    touches the memory on behalf of the program is what counts: std::vector's
    operator[] called from actors/x.cpp counts as actors/x.cpp, while a CAF
    header template (/usr/include/caf/..., even when instantiated in a
    project binary) or a frame in libcaf_*.so does not, because that code's
    synchronisation is what TSan cannot see.
  * Transparent frames are skipped like the runtime's: a replacement of the
    global operator new/delete (tests/test_faults.cpp makes allocations
    fail), and a constructor, destructor or assignment the compiler defined
    implicitly for a project type (TSan places it on the type's
    `struct`/`class` line; inlined, the frame has the bare name `~T` or `T`,
    and a closure's destructor is `~<lambda>`). Such a frame does its caller's work: CAF copying
    or destroying a message holding a task_spec is CAF's access, project
    code copying one is the project's. A special member written out in the
    source is not transparent. So is a message type's inspect function run
    by CAF's serializer or deserializer (`multidev::inspect<caf::deserializer>`
    and its lambdas): CAF filling a message it received on its I/O thread,
    which a handler on another thread then reads through CAF's mailbox.
  * A report is KEPT when it has at least one side and every side counts as
    project code; otherwise it is NOISE. A side whose stack TSan could not
    restore ("[failed to restore the stack]") counts as project code, so that
    an unknown never hides a report (raise history_size if that happens).
  * A "FATAL: ThreadSanitizer" line (TSan itself failed, the process ran
    uninstrumented or not at all) is printed and makes the exit status 1.
"""
import argparse
import collections
import os
import re
import sys

SEPARATOR = "=================="
FRAME = re.compile(r"^\s+#(\d+) (.*)$")
# "#3 name /path/file.cpp:12:7 (module+0x1234)" or "#3 name (module+0x1234)";
# the name may contain spaces (templates, "operator()"), so take the module
# from the end and the file from the last token before it.
MODULE = re.compile(r"^(.*) \(([^()]*)\+0x[0-9a-f]+\)$")
FILE_TOKEN = re.compile(r"^(.*) ((?:/|\.\./|\./)[^ ]*?)(?::\d+)?(?::\d+)?$")

RUNTIME_FILE_PREFIXES = ("/usr/include/c++/", "/usr/include/x86_64-linux-gnu/")
GLIBC_HEADER = re.compile(r"^/usr/include/[^/]+\.h$")
RUNTIME_FILE_PARTS = ("libsanitizer/", "/libstdc++-v3/", "/glibc-", "/nptl/", "/libgcc/")
RUNTIME_MODULES = re.compile(
    r"(^|/)(libc|libm|libstdc\+\+|libgcc_s|libtsan|libpthread|libdl|librt|ld-linux[^/]*)\.so")

CONTEXT_HEADERS = re.compile(
    r"^(Location is |Mutex M\d+ .*created at|Mutex M\d+ previously acquired by the same thread"
    r"|Thread T\d+ .*created by |As if synchronized via sleep)")


# Where the compiler ran: the base of a relative source path (main sets it).
BUILD_DIR = "/"


class Frame:
    def __init__(self, line):
        self.line = line.rstrip("\n")
        body = FRAME.match(line).group(2)
        self.module = ""
        m = MODULE.match(body)
        if m:
            body, self.module = m.group(1), m.group(2)
        self.file = ""
        self.line_no = 0
        self.func = body
        m = FILE_TOKEN.match(body)
        if m:
            self.func = m.group(1)
            # A relative path is relative to the directory the compiler ran
            # in (ccache's base_dir and -fdebug-prefix-map write them so).
            self.file = os.path.normpath(os.path.join(BUILD_DIR, m.group(2)))
            n = re.search(r":(\d+)(?::\d+)?$", body)
            if n:
                self.line_no = int(n.group(1))

    def is_runtime(self):
        f = self.file
        if f:
            return (f.startswith(RUNTIME_FILE_PREFIXES) or any(p in f for p in RUNTIME_FILE_PARTS)
                    or GLIBC_HEADER.match(f) is not None)
        return bool(self.module and RUNTIME_MODULES.search(self.module))


class Section:
    def __init__(self, header):
        self.header = header
        self.frames = []
        self.unrestored = False


class Report:
    def __init__(self, source, lines):
        self.source = source
        self.lines = lines
        self.kind = "unknown"
        self.summary = ""
        self.sections = []
        cur = None
        for line in lines:
            text = line.rstrip("\n")
            if text.startswith("WARNING: ThreadSanitizer: "):
                self.kind = re.sub(r" \(pid=\d+\)$", "", text[len("WARNING: ThreadSanitizer: "):])
                cur = Section("")  # frames straight under the warning line
                self.sections.append(cur)
            elif text.startswith("SUMMARY: ThreadSanitizer: "):
                self.summary = text[len("SUMMARY: ThreadSanitizer: "):]
            elif FRAME.match(text):
                if cur is None:
                    cur = Section("")
                    self.sections.append(cur)
                cur.frames.append(Frame(text))
            elif "[failed to restore the stack]" in text:
                if cur is not None:
                    cur.unrestored = True
            elif text.startswith("  ") and not text.startswith("   ") and text.endswith(":"):
                cur = Section(text.strip())
                self.sections.append(cur)
            elif text.strip():
                cur = None if not text.startswith("  ") else cur

    def sides(self):
        with_stack = [s for s in self.sections if s.frames or s.unrestored]
        sides = [s for s in with_stack if not CONTEXT_HEADERS.match(s.header)]
        return sides or with_stack


# A replacement of the global allocation functions (a test that makes
# allocations fail) is the allocator, as TSan's own operator new is.
REPLACED_ALLOCATOR = re.compile(r"^operator (new|delete)(\[\])?(\(|$)")
# A message's type's inspect function run by CAF's serializer or
# deserializer (include/multidev/protocol.hpp): CAF writing a message it
# received, or reading one it sends, on its I/O thread.
CAF_INSPECT = re.compile(r"(?:^|[\s:])multidev::inspect<caf::(?:de)?serializer>\(")
# A constructor, destructor or assignment operator: "ns::T::T(", "ns::T::~T(",
# "ns::T::operator=(".
SPECIAL_MEMBER = re.compile(r"(?:^|::)(\w+)::(?:~?\1|operator=)\(")
# The same inlined, where TSan names the frame by its bare name: "~T", "T".
BARE_SPECIAL_MEMBER = re.compile(r"^~?(\w+)$")
_source_cache = {}


def _source_line(path, n):
    if path not in _source_cache:
        try:
            with open(path, errors="replace") as fh:
                _source_cache[path] = fh.read().splitlines()
        except OSError:
            _source_cache[path] = []
    lines = _source_cache[path]
    return lines[n - 1] if 0 < n <= len(lines) else ""


def is_transparent(frame, root):
    """A frame that only does its caller's work: a replaced global operator
    new/delete, or a special member the compiler defined implicitly for a type
    of this repository (its line is the type's `struct`/`class` head: a
    member written out in the source has a line of its own). Such a frame
    is attributed to its caller: copying or destroying a project type inside
    CAF (a message's content) is CAF's access, inside project code the
    project's."""
    if REPLACED_ALLOCATOR.match(frame.func):
        return True
    if CAF_INSPECT.search(frame.func):
        return True  # CAF (de)serializing a message: its hand-off, not ours
    if frame.func.strip() == "~<lambda>" and in_repo(frame.file, root):
        return True  # a closure's destructor is always the compiler's
    m = SPECIAL_MEMBER.search(frame.func) or BARE_SPECIAL_MEMBER.match(frame.func.strip())
    if m is None or not in_repo(frame.file, root):
        return False
    head = _source_line(frame.file, frame.line_no)
    return re.match(r"^\s*(struct|class)\s+(\[\[[^]]*\]\]\s*)?%s\b" % re.escape(m.group(1)),
                    head) is not None


def top_frame(side, root):
    """The side's topmost frame outside the C/C++ runtime (and not
    transparent, see is_transparent), or None."""
    for f in side.frames:
        if not f.is_runtime() and not is_transparent(f, root):
            return f
    return None


def in_repo(path, root):
    return bool(path) and os.path.isabs(path) and (path == root or path.startswith(root + os.sep))


def side_is_project(side, root):
    if side.unrestored and not side.frames:
        return True
    f = top_frame(side, root)
    return f is not None and in_repo(f.file, root)


def read_reports(path, fatals):
    reports = []
    with open(path, errors="replace") as fh:
        lines = fh.readlines()
    current = None
    for line in lines:
        if line.startswith("FATAL: ThreadSanitizer") or line.startswith("ThreadSanitizer: CHECK failed") \
                or "ThreadSanitizer: unexpected memory mapping" in line:
            fatals.append((path, line.rstrip("\n")))
        if line.startswith(SEPARATOR):
            if current is not None and any(l.startswith("WARNING: ThreadSanitizer") for l in current):
                reports.append(Report(path, current))
                current = None
            else:
                current = []
            continue
        if current is not None:
            current.append(line)
            if line.startswith("WARNING: ThreadSanitizer") and len(current) > 1 \
                    and any(l.startswith("WARNING: ThreadSanitizer") for l in current[:-1]):
                # a report cut short (process killed): start again
                reports.append(Report(path, current[:-1]))
                current = [line]
    if current and any(l.startswith("WARNING: ThreadSanitizer") for l in current):
        reports.append(Report(path, current))  # truncated at the end of the file
    return reports


def log_files(args):
    for a in args:
        if os.path.isdir(a):
            for dirpath, _, names in os.walk(a):
                for n in sorted(names):
                    yield os.path.join(dirpath, n)
        else:
            yield a


def main():
    default_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="TSan log files or directories of them")
    ap.add_argument("--root", default=default_root, help="the repository (default: %(default)s)")
    ap.add_argument("--build-dir", default=None,
                    help="where the compiler ran, the base of relative source paths in the "
                         "reports (ccache's base_dir writes them) (default: ROOT/build-tsan)")
    ap.add_argument("--show-noise", type=int, default=10, metavar="N",
                    help="list the N most frequent noise summaries (default 10)")
    args = ap.parse_args()
    root = os.path.normpath(os.path.abspath(args.root))
    global BUILD_DIR
    BUILD_DIR = os.path.abspath(args.build_dir or os.path.join(root, "build-tsan"))

    fatals, kept, noise = [], [], []
    files = 0
    for path in log_files(args.logs):
        files += 1
        for r in read_reports(path, fatals):
            sides = r.sides()
            (kept if sides and all(side_is_project(s, root) for s in sides) else noise).append(r)

    total = len(kept) + len(noise)
    print(f"tsan-classify: {files} log file(s), {total} report(s): "
          f"{len(noise)} noise (a side outside the repository), {len(kept)} kept (every side in it)")
    if noise and args.show_noise:
        by_kind = collections.Counter(r.kind for r in noise)
        print("noise by kind: " + ", ".join(f"{k} {n}" for k, n in by_kind.most_common()))
        print(f"most frequent noise summaries (top {args.show_noise}):")
        for s, n in collections.Counter(r.summary for r in noise).most_common(args.show_noise):
            print(f"  {n:6d}  {s}")
    for path, line in fatals:
        print(f"tsan-classify: TSan failed in {path}: {line}")
    if kept:
        print(f"kept by summary: ")
        for s, n in collections.Counter(r.summary for r in kept).most_common():
            print(f"  {n:6d}  {s}")
    for i, r in enumerate(kept, 1):
        print(f"\n---- kept report {i} of {len(kept)} ({r.source}) ----")
        sys.stdout.write("".join(r.lines))
    return 1 if kept or fatals else 0


if __name__ == "__main__":
    sys.exit(main())
