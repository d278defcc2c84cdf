#!/usr/bin/env python3
"""Counts, per class defined in the given headers (default actors/**/*.hpp),
its data members and non-implicit member functions, from one clang AST
(-ast-dump=json). Run from the repository root after a build (build/include).
Needs clang++-14 (Debian clang-14). Prints "COUNT header:class", largest first."""
import glob, json, os, subprocess, sys, tempfile
hdrs = sys.argv[1:] or sorted(glob.glob('actors/**/*.hpp', recursive=True))
allh = set(os.path.abspath(h) for h in hdrs)
tu = tempfile.NamedTemporaryFile('w', suffix='.cpp', delete=False)
for h in hdrs:
    tu.write(f'#include "{os.path.abspath(h)}"\n')
tu.close()
inc = ['-I.', '-Iinclude', '-Ibuild/include', '-Ibuild', '-I/usr/local/cuda/include']
p = subprocess.run(['clang++-14', '-std=c++20', '-fsyntax-only', *inc,
                    '-Xclang', '-ast-dump=json', tu.name], capture_output=True, text=True)
if p.returncode != 0:
    sys.exit(p.stderr[:2000])
ast = json.loads(p.stdout)
cur = [None]
def track(l):
    if not isinstance(l, dict):
        return
    for k in ('spellingLoc', 'expansionLoc'):
        if k in l:
            track(l[k])
    if 'file' in l:
        cur[0] = l['file']
MEMBERS = ('FieldDecl', 'CXXMethodDecl', 'CXXConstructorDecl', 'CXXDestructorDecl',
           'CXXConversionDecl', 'FunctionTemplateDecl')
res = {}
def walk(n):
    track(n.get('loc'))
    r = n.get('range', {})
    track(r.get('begin')); track(r.get('end'))
    here = cur[0]
    if (n.get('kind') == 'CXXRecordDecl' and n.get('completeDefinition')
            and here and os.path.abspath(here) in allh):
        cnt = sum(1 for c in n.get('inner', [])
                  if not c.get('isImplicit') and c.get('kind') in MEMBERS)
        res[f"{os.path.relpath(here)}:{n.get('name')}"] = cnt
    for c in n.get('inner', []):
        walk(c)
walk(ast)
for k, v in sorted(res.items(), key=lambda kv: -kv[1]):
    print(v, k)
