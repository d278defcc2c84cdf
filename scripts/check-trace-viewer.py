#!/usr/bin/env python3
"""Opens a Chrome trace (multidev run --trace) in Catapult's trace viewer, the
viewer behind chrome://tracing, in headless Chromium, and checks what it
imported: a thread per lane, the slices, every flow bound to a slice at both
ends, no import warning. A manual check (CI has no Catapult checkout):

    scripts/check-trace-viewer.py CATAPULT_DIR TRACE.json [SCREENSHOT.png]

CATAPULT_DIR is a checkout of https://github.com/catapult-project/catapult
(its tracing/bin/trace2html makes the viewer page). Needs python3 and the
Debian package chromium; talks to Chromium over the DevTools protocol with the
standard library only. Exit status 0 when the viewer imported the trace
cleanly, 1 otherwise.
"""
import base64, json, os, socket, struct, subprocess, sys, tempfile, time, urllib.request

if len(sys.argv) < 3:
    sys.exit(__doc__)
catapult, trace = sys.argv[1], os.path.abspath(sys.argv[2])
out_png = sys.argv[3] if len(sys.argv) > 3 else None
work = tempfile.mkdtemp(prefix="trace-viewer-")
page = os.path.join(work, "trace.html")
subprocess.run([sys.executable, os.path.join(catapult, "tracing/bin/trace2html"), trace,
                "--output=" + page], check=True, stdout=subprocess.DEVNULL)
url, wait_s = "file://" + page, 10.0
MODEL_JS = """
(() => {
  const v = document.querySelector('tr-ui-timeline-view');
  if (!v || !v.model) return {error: 'the viewer has no model'};
  const m = v.model, threads = {};
  for (const p of Object.values(m.processes))
    for (const t of Object.values(p.threads))
      threads[t.name] = t.sliceGroup.slices.length;
  return {threads, flows: m.flowEvents.length,
          flows_bound: m.flowEvents.filter(f => f.startSlice && f.endSlice).length,
          warnings: m.importWarnings.map(w => w.message)};
})()
"""
port = 9333
chrome = subprocess.Popen(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                           "--user-data-dir=" + os.path.join(work, "profile"), "--window-size=1400,800",
                           f"--remote-debugging-port={port}", "about:blank"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(100):
        try:
            tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
            break
        except Exception:
            time.sleep(0.2)
    ws_url = [t for t in tabs if t["type"] == "page"][0]["webSocketDebuggerUrl"]
    host, path = ws_url[len("ws://"):].split("/", 1)
    h, p = host.split(":")
    s = socket.create_connection((h, int(p)))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    resp = b""
    while b"\r\n\r\n" not in resp:
        resp += s.recv(1)
    def send(obj):
        data = json.dumps(obj).encode()
        mask = os.urandom(4)
        hdr = bytes([0x81])
        n = len(data)
        if n < 126: hdr += bytes([0x80 | n])
        elif n < 65536: hdr += bytes([0x80 | 126]) + struct.pack(">H", n)
        else: hdr += bytes([0x80 | 127]) + struct.pack(">Q", n)
        s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
    def recv_exact(n):
        b = b""
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c: raise EOFError
            b += c
        return b
    def recv():
        msg = b""
        while True:
            b1, b2 = recv_exact(2)
            n = b2 & 0x7f
            if n == 126: n = struct.unpack(">H", recv_exact(2))[0]
            elif n == 127: n = struct.unpack(">Q", recv_exact(8))[0]
            msg += recv_exact(n)
            if b1 & 0x80: return json.loads(msg)
    ids = [0]
    def call(method, **params):
        ids[0] += 1
        send({"id": ids[0], "method": method, "params": params})
        while True:
            m = recv()
            if m.get("id") == ids[0]:
                return m
    call("Page.enable")
    call("Page.navigate", url=url)
    time.sleep(wait_s)
    r = call("Runtime.evaluate", expression=MODEL_JS, returnByValue=True)
    model = r.get("result", {}).get("result", {}).get("value") or {"error": "no answer"}
    print(json.dumps(model, indent=1))
    if out_png:
        shot = call("Page.captureScreenshot", format="png")
        open(out_png, "wb").write(base64.b64decode(shot["result"]["data"]))
finally:
    chrome.kill()

expected = json.load(open(trace))["traceEvents"]
slices = sum(e["ph"] == "X" for e in expected)
flows = sum(e["ph"] == "s" for e in expected)
ok = ("error" not in model and not model["warnings"]
      and sum(model["threads"].values()) == slices
      and model["flows"] == flows == model["flows_bound"])
print(f"{'ok' if ok else 'FAILED'}: the trace has {slices} slices and {flows} flows")
sys.exit(0 if ok else 1)
